from warrenmq.server.cli import main

raise SystemExit(main())
