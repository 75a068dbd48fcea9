"""Compile the "relpos_triton" kernels ahead of time for a GPU architecture, without a GPU: every autotuning
configuration of the forward and both backward kernels, for a head size, dtype and set of flags, with the shared
memory each needs (an H100/H200 has 228 KB per SM, 227 KB usable by one block). A
configuration that does not compile is printed as FAILED and the exit status is 1.

    python -m benchmarks.compile_triton_kernels --arch 90 --dtype bf16
    python -m benchmarks.compile_triton_kernels --arch 90 --dtype fp32 --head-dim 128 --quick
    python -m benchmarks.compile_triton_kernels --arch 90 --sass    # + SASS instructions and register spills

`--sass` disassembles each kernel (triton's bundled cuobjdump) and counts its instructions and its local-memory
stores and loads (STL/LDL: registers spilled); static counts of the whole kernel, each loop body counted once, a proxy
for run time where no GPU is at hand, not a measurement of it.

Runs triton's compiler and its bundled ptxas on the CPU; TRITON_INTERPRET must be unset (it is removed here before
triton is imported).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time

HOPPER_SHARED_MEMORY = 232448   # bytes one block may use on sm_90 (H100, H200)


def argument_types(arg_names: list[str], constexprs: dict, dtype: str) -> dict[str, str]:
    """Triton signature types of the kernels' arguments: tensors of `dtype` (inputs, outputs and their gradients, the
    bias table's among them), float32/float64 statistics, int32 key ranges, an int64 seed."""
    statistics = "fp64" if dtype == "fp64" else "fp32"
    pointers = {"Q": dtype, "K": dtype, "V": dtype, "T": dtype, "OUT": dtype, "DO": dtype, "DQ": dtype, "DK": dtype,
                "DV": dtype, "DT": dtype, "M": statistics, "LSE": statistics, "DELTA": statistics,
                "DM": statistics, "SCALES": statistics, "KEY_START": "i32", "KEY_END": "i32"}
    types = {}
    for name in arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        elif name in pointers:
            types[name] = "*" + pointers[name]
        else:
            types[name] = {"seed": "i64"}.get(name, "i32")
    return types


INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);")   # cuobjdump -sass: /*01a0*/  @P0 LDG.E R2, [R4] ;


def sass_listing(cubin: bytes) -> str:
    """A compiled kernel's SASS as triton's bundled cuobjdump prints it (read here, not through triton's parser,
    which before triton 3.9 stops at the 4096th instruction)."""
    from triton.tools.disasm import path_to_cuobjdump

    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        return subprocess.run([path_to_cuobjdump(), "-sass", handle.name], capture_output=True, text=True,
                              check=True).stdout


def sass_counts(listing: str) -> str:
    """Instructions, and local-memory stores and loads (register spills), in a cuobjdump SASS listing."""
    opcodes = collections.Counter()
    for instruction in INSTRUCTION.findall(listing):
        words = instruction.split()
        if words[0].startswith("@"):   # a predicate guards the instruction
            words = words[1:]
        opcodes[words[0].split(".")[0]] += 1
    return f"SASS {sum(opcodes.values())} instructions, STL {opcodes['STL']}, LDL {opcodes['LDL']}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (90: H100/H200)")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32", "fp64"), default="bf16")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--max-relative-position", type=int, default=16)
    parser.add_argument("--sass", action="store_true", help="also count SASS instructions and spills (STL/LDL)")
    parser.add_argument("--quick", action="store_true",
                        help="only the first autotuning configuration and the first set of flags (a^V, dropout)")
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hf_relpos.model import triton_relative_kernels as kernels
    from hf_relpos.model.positions import aligned_width
    from hf_relpos.model.triton_relative import COMPILE_OPTIONS, settings_for

    target = GPUTarget("cuda", args.arch, 32)
    configs = kernels.tuned_forward.configs[:1] if args.quick else kernels.tuned_forward.configs
    # (a^K, a^V, causal, dropout): Shaw's encoder and decoder with dropout, shaw-k without it, a^V alone
    flag_sets = ((True, True, False, True), (True, True, True, True), (True, False, False, False),
                 (False, True, False, True))[:1 if args.quick else None]
    failed = 0

    def build(kernel, constexprs: dict, warps: int, stages: int, label: str) -> None:
        nonlocal failed
        started = time.time()
        try:
            compiled = triton.compile(
                ASTSource(kernel, argument_types(kernel.arg_names, constexprs, args.dtype), constexprs=constexprs),
                target=target, options={"num_warps": warps, "num_stages": stages, **COMPILE_OPTIONS})
        except Exception as error:  # the compiler's own errors have no common base class
            failed += 1
            print(f"FAILED {label}: {type(error).__name__}: {error}", flush=True)
            return
        shared = compiled.metadata.shared
        fits = "fits" if shared <= HOPPER_SHARED_MEMORY else "EXCEEDS sm_90's shared memory"
        sass = f", {sass_counts(sass_listing(compiled.asm['cubin']))}" if args.sass else ""
        print(f"ok {label}: shared memory {shared} B ({fits}), compiled in {time.time() - started:.1f} s{sass}",
              flush=True)

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}[args.dtype]
    for (has_bias, has_values, causal, dropout), config in itertools.product(flag_sets, configs):
        # the settings a call launches with (the masses as wide as `RelativeValues.mass_columns`)
        settings, keys_settings = settings_for(
            args.head_dim, dtype, args.max_relative_position, has_bias,
            aligned_width(2 * args.max_relative_position + 1) if has_values else 0, causal, dropout, False)
        for name, kernel, constexprs in (("forward", kernels.relative_forward_kernel, settings),
                                         ("backward_keys", kernels.relative_backward_keys_kernel, keys_settings),
                                         ("backward_queries", kernels.relative_backward_queries_kernel, settings)):
            build(kernel, {**constexprs, **config.kwargs}, config.num_warps, config.num_stages,
                  f"{name} {args.dtype} sm_{args.arch} d={args.head_dim} {'' if has_bias else 'a^K=False '}"
                  f"a^V={has_values} causal={causal} "
                  f"dropout={dropout} {config.kwargs} warps={config.num_warps} stages={config.num_stages}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
