"""Notebooks 04 to 08: what is cached and where. Block ids and their hashes (``blocks``,
``block_manager``), the paged pools (``paged``), the contiguous layouts and their addresses
(``layout``, ``addresses``), the long-context caches (``window``, ``quantized``, ``latent`` over
``hf_cache`` and ``rope``) and a recurrence's state (``recurrence``, ``scan``, ``mamba``)."""
