"""`specverify bench`: the verifier beside the read floor, softmax and what peers run, timed on the same logits.

inputs.py (the logits with the realistic row mix, a draft tree) and peers.py (a sort-based sampler,
FlashInfer, MAX) -> cases.py (the typed cases: `Mode`, `Role`, `Case`) -> measure.py (timing, peak memory,
the traffic meter, the results; shared with the device check's timing section) -> report.py (the table,
the progress lines) and command.py (the arguments, checked once into `BenchSettings`, and the run).
"""
