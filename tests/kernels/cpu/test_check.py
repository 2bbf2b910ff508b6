"""How the CPU kernels refuse input. On the H100 test machine (Ubuntu 24.04's
GCC 13.3 against torch 2.11.0+cu130) a refusal whose message was built by
c10::str, the std::ostringstream inside TORCH_CHECK and AT_DISPATCH's default
case, killed the process with SIGSEGV instead of raising, so a bad request
took the engine down. The kernels refuse through PAGODA_CHECK (check.h),
which formats with vsnprintf. This machine cannot reproduce the crash, so
the sources are held to that, and the printf-formatted messages are checked
to say what they said before."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pagoda.kernels.cpu import HEADERS, SOURCES, build

# What builds a message with an iostream in this extension's own code.
IOSTREAM_MESSAGES = re.compile(
    r"\b(TORCH_CHECK\w*|TORCH_INTERNAL_ASSERT\w*|AT_ERROR|AT_DISPATCH\w*|c10::str|"
    r"std::(o|i)?stringstream|std::ostream)\b"
)


def code_lines(path: Path):
    for number, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("//", 1)[0]
        if code.strip():
            yield number, code


def test_no_kernel_source_builds_a_message_with_an_iostream():
    found = [
        f"{path.name}:{number}: {code.strip()}"
        for path in SOURCES + HEADERS
        for number, code in code_lines(path)
        if IOSTREAM_MESSAGES.search(code)
    ]
    assert not found, "use PAGODA_CHECK / pagoda_cpu::fail (check.h):\n" + "\n".join(found)


def test_the_pattern_finds_what_it_must():
    for line in ('TORCH_CHECK(ok, "x");', "AT_DISPATCH_FLOATING_TYPES(t, n, f)", "c10::str(a, b)"):
        assert IOSTREAM_MESSAGES.search(line)
    assert not IOSTREAM_MESSAGES.search('PAGODA_CHECK(ok, "slot %lld", n);')


@pytest.fixture(scope="module")
def ext():
    return build()


def test_refusals_format_their_numbers(ext):
    with pytest.raises(RuntimeError, match=r"^token id 9 outside the vocabulary \(4\)$"):
        ext.embedding(torch.tensor([0, 9]), torch.randn(4, 8))
    with pytest.raises(RuntimeError, match=r"^token id -1 outside the vocabulary \(4\)$"):
        ext.embedding(torch.tensor([-1]), torch.randn(4, 8))
    cache = torch.zeros(2, 3, 16, 1, 8)
    k = torch.randn(1, 1, 8)
    with pytest.raises(
        RuntimeError, match=r"^slot 9223372036854775807 outside the cache \(48 slots\)$"
    ):
        ext.reshape_and_cache(k, k, cache, torch.tensor([2**63 - 1]))
    with pytest.raises(RuntimeError, match=r"^no packed linear for Int on this CPU$"):
        ext.pack_linear_weight(torch.ones(4, 4, dtype=torch.int32))


def test_a_wrong_argument_type_raises_type_error_not_a_crash(ext):
    """pybind11 builds its own "incompatible function arguments" message inside
    the extension's code; in a child process, so a crash fails this test
    instead of killing the run."""
    code = (
        "import torch\n"
        "from pagoda.kernels.cpu import build\n"
        "ext = build()\n"
        "for call in (lambda: ext.embedding('tokens', torch.randn(4, 8)),\n"
        "             lambda: ext.embedding(torch.tensor([0]), 3.5)):\n"
        "    try:\n"
        "        call()\n"
        "    except TypeError as e:\n"
        "        assert 'incompatible function arguments' in str(e), e\n"
        "    else:\n"
        "        raise AssertionError('no TypeError')\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (
        done.returncode,
        done.stderr[-2000:],
    )
