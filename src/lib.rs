//! Integration tests and examples of gen_durable live in `tests/` and `examples/`.
