"""Fictional names for generated tasks: pronounceable, unique, deterministic in the rng.

The generated worlds of `tool_use` and `search` are made of entities no pretrained model has
seen, so a task can only be solved from what the env returns (tool responses, retrieved
passages), never from memory.
"""
import random

_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "kl", "l", "m", "n", "p", "qu",
           "r", "s", "st", "t", "tr", "v", "w", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "m", "nd", "x")


def word(rng: random.Random, syllables: int) -> str:
  """One capitalised pseudo-word of `syllables` consonant-vowel(-coda) syllables."""
  parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
  return ("".join(parts) + rng.choice(_CODAS)).capitalize()


def names(rng: random.Random, count: int, *, min_syllables: int = 2,
          max_syllables: int = 3, taken=()) -> list[str]:
  """`count` distinct pseudo-words, none in `taken` (compared case-insensitively)."""
  if count < 0 or not 1 <= min_syllables <= max_syllables:
    raise ValueError(f"need count >= 0 and 1 <= min_syllables <= max_syllables, got {count}, "
                     f"{min_syllables}, {max_syllables}.")
  seen = {name.lower() for name in taken}
  out = []
  # Collisions are rare (hundreds of thousands of 2-3 syllable words); the bound only stops a
  # request that the alphabet cannot satisfy.
  for _ in range(100 * count + 100):
    if len(out) == count:
      return out
    candidate = word(rng, rng.randint(min_syllables, max_syllables))
    if candidate.lower() not in seen:
      seen.add(candidate.lower())
      out.append(candidate)
  if len(out) == count:
    return out
  raise ValueError(f"could not draw {count} distinct names with {min_syllables}-"
                   f"{max_syllables} syllables.")
