"""Writes `input.txt`, the text chargpt reads from its working directory, offline.

chargpt trains on Shakespeare's plays (tinyshakespeare), which cannot be downloaded here. Instead: 60 KB
of verse-like lines from a small fixed vocabulary, drawn with a fixed seed, so a character model has
structure to learn (spelling, spacing, line ends) and every run sees the same text.
"""

import random
from pathlib import Path

WORDS = ["thou", "art", "the", "king", "and", "my", "lord", "shall", "not", "speak", "of", "love", "night",
         "good", "sweet", "what", "is", "this", "heart", "come", "hither", "fair", "lady", "o", "god"]


def line(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 9))]
    return " ".join(words).capitalize() + rng.choice([",", ".", "!", ";"])


def main() -> None:
    rng = random.Random(0)
    lines, size = [], 0
    while size < 60_000:
        lines.append(line(rng))
        size += len(lines[-1]) + 1
    Path("input.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
