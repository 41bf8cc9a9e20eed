"""``python -m seq2seq.cli ARGS``: the ``seq2seq`` console script (used by DDP and torchrun)."""

from seq2seq.cli.entry import main

raise SystemExit(main())
