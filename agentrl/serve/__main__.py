"""`python -m agentrl.serve --run_dir=DIR`: serve a finished run (agentrl/serve/main.py)."""
from absl import app

from agentrl.harness import cli
from agentrl.serve import main

if __name__ == "__main__":
  main.define_flags()
  app.run(main.main, flags_parser=cli.parse_flags)
