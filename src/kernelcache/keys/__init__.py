"""Cache keys: make_program_cache_key, the option policy table, the toolchain identity."""
