"""Decode across devices on ``torch.distributed`` (notebook 12, "Decode across devices").

One module per mechanism: ``launch`` (starting the ranks), ``tensor`` (tensor-parallel decode with
transformers' own tensor-parallel plan), ``context`` (context-parallel decode attention, merged as
the split-K kernel merges) and ``disaggregated`` (a prefill rank hands a prompt's paged KV blocks
to a decode rank). Their cost model is ``kvlab.theory.parallel``; their measurements are in
``kvlab.lab.parallel``.
"""
