"""Helpers shared by every test tier and by the benchmarks (`tests.support.*`).

- process: `inferwire serve` as a real process on 127.0.0.1:0, and the CLI
- status: google.rpc error details of a failed call
- waiting: polling and stream-reading helpers for async tests
- engine: settings of the in-process server the engine tier shares
- triton: real `tritonserver` processes for the Triton tier and its benchmark
"""
