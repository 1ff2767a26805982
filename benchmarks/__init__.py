"""The orchestrator performance suite: run it with ``python -m benchmarks`` (``make bench``).

Each run prints a table, compares it with the previous run's ``benchmarks/results/latest.json``
and then overwrites that file. Numbers are never asserted by the test suite; the issue that
introduces a benchmark says what it must reach, and the table shows that target.
"""
