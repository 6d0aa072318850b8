"""Every notebook: presentation only. ``format`` writes numbers, ``readings`` the sentences that
depend on a measurement (no matplotlib), ``plots`` the figures, ``widgets`` the sliders,
``notebook`` the problem sizes and the Markdown output of a reading."""
