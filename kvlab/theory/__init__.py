"""Every notebook: the torch-free formulas, importable without torch.

``roofline`` (one decode step's bytes, FLOPs and floor; admission; crossovers; prefill and
transfer), ``memory_wall`` (the footprint model and design rules), ``work`` (the loops' work in
closed form), ``verdict`` (section 9.8's verdict), ``matmul`` (GEMV counts and the roofline fit),
``cache_sizes`` and ``ssm`` (what each design caches, what scans cost), ``specs`` and ``shapes``
(the devices and models the sources reason about), ``decode_step`` and ``peers`` (what a decode step
should cost and the targets beside ``generate``, notebooks 01 to 03), ``paging``,
``kernel_rounding``, ``prefix`` and ``serving`` (the models notebooks 05, 05b, 06 and 11 read their
measurements against).
"""
