"""Every error text of our C++ sources is one string literal or one vc::text(...), and nothing there writes to a stream.

On the H200 image (torch 2.11.0+cu130) a number written through an std::ostream inside one of our JIT-built
extensions ended the process with SIGSEGV (bench/refusal_probe.py; docs/kernel-notes.md section 31). TORCH_CHECK
formats a message of several parts through an std::ostringstream, and passes a single string through untouched;
kernels/csrc/refusal_text.h builds texts with std::to_string instead. A refusal that ends the process takes the
ComfyUI server down with it, so this is checked on every file, not left to review.
"""
import re
from pathlib import Path

import pytest

from vc_attention.kernels import jit

SOURCES = sorted(p for ext in ("*.cpp", "*.h", "*.cu", "*.cuh") for p in jit.CSRC_DIR.glob(ext))
# the macros that format their message arguments with c10::str
MACRO = re.compile(r"\b(TORCH_CHECK(?:_VALUE|_TYPE|_INDEX|_NOT_IMPLEMENTED|_LINALG)?|TORCH_INTERNAL_ASSERT|TORCH_WARN(?:_ONCE)?"
                   r"|AT_ERROR|C10_THROW_ERROR)\s*\(")
# what no source of ours may use: each formats through a stream
STREAMS = re.compile(r"\bc10::str\s*\(|\bstd::(?:o|i)?stringstream\b|\bstd::ostream\b|\bstd::cout\b|\bstd::cerr\b"
                     r"|#include\s*<(?:sstream|iostream)>")
LITERALS = re.compile(r'^\s*(?:"(?:[^"\\]|\\.)*"\s*)+$')
# macros whose first argument is not a condition
NO_CONDITION = {"AT_ERROR", "TORCH_WARN", "TORCH_WARN_ONCE"}


def strip_comments(src: str) -> str:
    """Comments blanked out (string literals kept as they are), so a comment that names a macro is no call."""
    out, i = [], 0
    while i < len(src):
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = len(src) if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            out.append("\n" * src.count("\n", i, j))
            i = j + 2
        elif src[i] in "\"'":
            quote, j = src[i], i + 1
            while src[j] != quote:
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


def top_level_args(src: str, start: int) -> list[str]:
    """The comma-separated arguments of the call whose '(' ends just before `start`."""
    depth, i, args, begin = 0, start, [], start
    while True:
        c = src[i]
        if c in "\"'":
            j = i + 1
            while src[j] != c:
                j += 2 if src[j] == "\\" else 1
            i = j
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                args.append(src[begin:i])
                return args
            depth -= 1
        elif c == "," and depth == 0:
            args.append(src[begin:i])
            begin = i + 1
        i += 1


def violations(src: str) -> list[str]:
    """Each formatting call or stream use of one source's text that could write a number through a stream."""
    src = strip_comments(src)
    found = [f"line {src.count(chr(10), 0, m.start()) + 1}: {m.group(0).strip()}" for m in STREAMS.finditer(src)]
    for m in MACRO.finditer(src):
        if src[:m.start()].rstrip().endswith("#define"):
            continue
        args = top_level_args(src, m.end())
        message = args if m.group(1) in NO_CONDITION else args[1:]
        if m.group(1) == "C10_THROW_ERROR":
            message = args[1:]  # (ErrorType, message)
        ok = not message or (len(message) == 1 and (LITERALS.match(message[0])
                                                    or message[0].strip().startswith("vc::text(")))
        if not ok:
            line = src.count("\n", 0, m.start()) + 1
            found.append(f"line {line}: {m.group(1)} with message {', '.join(a.strip() for a in message)}")
    return found


def test_the_sources_are_found():
    names = {p.name for p in SOURCES}
    assert {"sm90_binding.cpp", "prepare_binding.cpp", "grouping_binding.cpp", "attn_mma_binding.cpp",
            "binding_checks.h", "refusal_text.h"} <= names


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_no_number_goes_through_a_stream(source: Path):
    assert violations(source.read_text()) == []


@pytest.mark.parametrize("snippet", [
    'TORCH_CHECK_VALUE(d == 64, "head dim must be 64, got ", d, ".");',
    'TORCH_CHECK(ok, name, " must be contiguous.");',
    'TORCH_CHECK(rc == 0, "launch failed: ", err);',
    'TORCH_WARN("slow path for ", n, " rows");',
    'std::string s = c10::str("x", 3);',
    'std::ostringstream os; os << 3;',
    '#include <sstream>\n',
])
def test_the_check_catches_a_formatted_message(snippet):
    assert violations(snippet), snippet


@pytest.mark.parametrize("snippet", [
    'TORCH_CHECK_VALUE(d == 64, vc::text("head dim must be 64, got ", d, "."));',
    'TORCH_CHECK_VALUE(ok, "a plain sentence, " "in two literals.");',
    'TORCH_CHECK(f(a, b), vc::text(name, " has dtype ", t.scalar_type(), "."));',
    '// TORCH_CHECK(x, "in a comment ", n);\nint y = 0;',
    '#define CHECK_OK(x) TORCH_CHECK(x)\n',
])
def test_the_check_passes_literals_and_vc_text(snippet):
    assert violations(snippet) == [], snippet
