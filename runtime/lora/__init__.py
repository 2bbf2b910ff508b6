"""Multi-LoRA serving: PEFT adapters applied per token in mixed batches."""
