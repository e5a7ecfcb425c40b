"""Writing outputs that a crash, a full disk or Ctrl-C never leaves half-written: temporaries, space,
signals, renames.
"""
