"""Notebooks 05, 06 and 11: kvlab's one serving stack over the paged KV cache of :mod:`kvlab.cache`.

In the order a step runs: ``request`` (the one request type and the event log), ``scheduler`` (who
runs, with how many tokens), ``attention`` (the one attention function registered with transformers,
and the step's metadata), ``runner`` (one forward pass per step), ``engine`` (the three together);
``paged_decode`` holds the plain loops of notebooks 05 and 06 on the same parts.
"""
