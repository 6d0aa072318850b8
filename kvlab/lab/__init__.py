"""Every notebook: the laboratory, the machine and what is measured on it.

``hardware``, ``timing``, ``models``, ``trained`` and ``bench`` serve every page; the other modules
hold one notebook's measurements, sweeps, profiles and ``bench_rows``, and call the mechanisms of
``kvlab.decode`` and ``kvlab.cache`` through their public names.
"""
