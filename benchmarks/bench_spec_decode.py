"""Speculative decoding: speculation off, n-gram and a draft model, in one run.

Two workloads, each at concurrency 1 (one request at a time) and 8 (eight at
once), on the built-in SmolLM2 through the offline engine:

  grounded   "copy/edit this passage" chat prompts: the answer quotes its
             input, where n-gram prompt lookup shines
  random     prompts of random token ids, output forced to its length
             (ignore_eos): nothing to look up

Greedy decoding, so every configuration emits the same tokens (the tests
prove it) and only speed differs. Per configuration: TPOT (mean over
requests of (last token - first token) / (tokens - 1)), output tokens/s over
the wall time, and the acceptance rate (accepted / drafted tokens).

    python benchmarks/bench_spec_decode.py --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from pagoda.runtime import SamplingParams
from pagoda.runtime.config import EngineArgs
from pagoda.runtime.engine.llm_engine import LLMEngine
from pagoda.runtime.engine.output_processor import OutputKind

PASSAGES = [
    "The river town woke slowly. Fishermen carried their nets down to the water, "
    "the baker opened his shutters, and the bell of the old church rang seven times. "
    "Children ran along the quay, shouting at the gulls that circled the boats.",
    "To install the tool, download the archive, unpack it into a folder of your "
    "choice, and add that folder to your PATH. Then open a new terminal and run "
    "the command with the --version flag to check that everything works.",
    "Our quarterly results show revenue up twelve percent, driven by strong sales "
    "in Europe and Asia. Costs rose by four percent, mostly because of new hires "
    "in engineering. We expect growth to continue through the next two quarters.",
    "The recipe needs two cups of flour, one cup of sugar, three eggs and a pinch "
    "of salt. Mix the dry ingredients first, then add the eggs one at a time, "
    "stirring well after each. Bake for forty minutes at one hundred eighty degrees.",
]
TASKS = [
    "Repeat the following text exactly, word for word:\n\n{}",
    "Fix any typos in the following text and return the whole text:\n\n{}",
]


def grounded_prompts(tokenizer, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        passage = PASSAGES[i % len(PASSAGES)]
        task = TASKS[(i // len(PASSAGES)) % len(TASKS)]
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": task.format(passage)}],
            tokenize=False,
            add_generation_prompt=True,
        )
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


def random_prompts(vocab: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(n)]


def run(engine: LLMEngine, prompts, params, concurrency: int) -> dict:
    """Serve `prompts` keeping `concurrency` in flight; per-request timings."""
    first, last, counts = {}, {}, {}
    todo = list(enumerate(prompts))
    in_flight = 0
    start = time.perf_counter()
    while todo or engine.has_unfinished_requests():
        while todo and in_flight < concurrency:
            i, p = todo.pop(0)
            engine.add_request(f"r{i}", None, params, OutputKind.DELTA, prompt_token_ids=p)
            in_flight += 1
        for out in engine.step():
            now = time.perf_counter()
            n = len(out.outputs[0].token_ids)
            if n:
                first.setdefault(out.request_id, now)
                last[out.request_id] = now
                counts[out.request_id] = counts.get(out.request_id, 0) + n
            if out.finished:
                in_flight -= 1
    wall = time.perf_counter() - start
    tpots = [(last[r] - first[r]) / (counts[r] - 1) for r in counts if counts[r] > 1 and r in first]
    return {
        "tpot_ms": 1000 * statistics.mean(tpots),
        "output_tok_s": sum(counts.values()) / wall,
        "tokens": sum(counts.values()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=8, help="requests at concurrency 8")
    ap.add_argument("--requests-c1", type=int, default=4, help="requests at concurrency 1")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--draft-layers", type=int, default=8)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--configs", default="off,ngram,draft")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()

    specs = {
        "off": None,
        "ngram": {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4},
        "draft": {
            "method": "draft_model",
            "model": "smollm2-135m-instruct",
            "num_speculative_tokens": args.k,
            "hf_overrides": {"num_hidden_layers": args.draft_layers},
        },
    }
    results = []
    for name in args.configs.split(","):
        engine = LLMEngine(
            EngineArgs(dtype=args.dtype, max_model_len=1024, speculative_config=specs[name])
        )
        tok = engine.tokenizer
        workloads = {
            "grounded": (
                grounded_prompts(tok, args.requests),
                SamplingParams(temperature=0, max_tokens=args.max_tokens),
            ),
            "random": (
                random_prompts(engine.model_config.vocab_size, args.requests, 128),
                SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True),
            ),
        }
        # Warm-up: first-call costs (allocator, lazy imports) out of the numbers.
        run(engine, workloads["random"][0][:1], SamplingParams(max_tokens=4), 1)
        for wname, (prompts, params) in workloads.items():
            for conc in (1, 8):
                sched = engine.engine_core.scheduler
                before = sched.make_stats().spec_decoding
                n = args.requests_c1 if conc == 1 else args.requests
                r = run(engine, prompts[:n], params, conc)
                after = sched.make_stats().spec_decoding
                if after is not None:
                    drafted = after.num_draft_tokens - before.num_draft_tokens
                    accepted = after.num_accepted_tokens - before.num_accepted_tokens
                    r["acceptance"] = accepted / drafted if drafted else 0.0
                    r["drafted"] = drafted
                r.update(config=name, workload=wname, concurrency=conc)
                results.append(r)
                print(json.dumps(r), flush=True)
        engine.shutdown()
        del engine
    print()
    print("| workload | conc | config | TPOT ms | output tok/s | acceptance | drafted |")
    print("|---|---|---|---|---|---|---|")
    for r in sorted(results, key=lambda r: (r["workload"], r["concurrency"])):
        acc = f"{r['acceptance']:.0%}" if "acceptance" in r else "-"
        print(
            f"| {r['workload']} | {r['concurrency']} | {r['config']} | {r['tpot_ms']:.1f} | "
            f"{r['output_tok_s']:.1f} | {acc} | {r.get('drafted', '-')} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
