"""Notebooks 05, 06 and 11: kvlab's serving stack over the paged KV cache of :mod:`kvlab.cache`, in
the order a step runs: ``request``, ``scheduler``, ``attention``, ``runner``, ``engine`` (the three
together); ``paged_decode`` holds the plain loops of notebooks 05 and 06 on the same parts."""
