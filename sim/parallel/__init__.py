"""One module per parallelism, each adding its ops to the rank programs (torchtitan style)."""
