"""Writes `words.txt`, the one-word-a-line input makemore reads (`--input-file words.txt`), offline.

The words are name-like: two to four syllables from a small fixed syllable set, drawn with a fixed seed,
so a character model has structure to learn (which letters follow which) and the run is the same every
time. 4000 words of 4 to 12 letters; makemore keeps 10% of them (at most 1000) for its test split.
"""

import random
from pathlib import Path

ONSETS = ["b", "d", "k", "l", "m", "n", "r", "s", "t", "v", "sh", "th", "br", "kl"]
VOWELS = ["a", "e", "i", "o", "u", "ia", "ei"]
CODAS = ["", "", "", "n", "r", "l", "s"]


def word(rng: random.Random) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(rng.randint(2, 4)))


def main() -> None:
    rng = random.Random(0)
    Path("words.txt").write_text("".join(word(rng) + "\n" for _ in range(4000)))


if __name__ == "__main__":
    main()
