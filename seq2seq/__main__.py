from seq2seq.commands.cli import main

raise SystemExit(main())
