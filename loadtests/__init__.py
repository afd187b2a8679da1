"""Load and latency tests: locust scenarios, benchmarks and the emulated WAN they run over."""
