"""Kernel contracts (seed 004, "FKC"): parse, validate, register, pick, test and measure kernels.

- parser.py / schema.py: .fkc.md files -> typed `KernelContract`s (field spec + dataclasses)
- expr.py: the safe formula / predicate language of cost and shape fields
- ops.py: the op-kind vocabulary registrable contracts implement (interfaces, dims, dtype names)
- rules.py: dtype / shape rules of operands, evaluated for a concrete call
- validate.py: the named validation rules (`RULES`), `check_file`
- registry.py: load + validate + bind the package's contracts; judge measurements
- picker.py: `pick(op, dtypes, shapes, params, backend)` -> the best bound kernel
- harness.py / conformance.py: per-op references and the contract-driven conformance run
- judge.py: GPU measurements (µs, GB/s, error, bit-stability) -> JSON + markdown
- cli.py: `minfer kernels` and `minfer judge`

docs/KERNEL-CONTRACTS.md describes the format and every rule.
"""
