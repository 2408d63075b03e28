"""Writes `data/wikitext-2.txt`, the file Lightning's `WikiText2` demo dataset reads from the working
directory (it downloads it only when the file is missing), offline.

Not WikiText-2: about 160,000 words of sentences from a small grammar, drawn with a fixed seed, one
sentence a line. The script splits the dataset into 35-token samples and holds out 4,000 of them
(2,000 validation, 2,000 test), so this size leaves it about 400 training samples (20 batches an epoch):
its 20 epochs take seconds, and the text has structure a language model learns.
"""

import random
from pathlib import Path

SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the teacher", "a bird", "the farmer", "our neighbour"]
VERBS = ["sees", "likes", "feeds", "follows", "paints", "finds", "carries", "watches"]
OBJECTS = ["the ball", "a red apple", "the small boat", "a letter", "the garden", "some bread", "the old map"]
PLACES = ["", "", "in the park", "at home", "near the river", "after school", "on the hill"]
WORDS = 160_000


def sentence(rng: random.Random) -> str:
    return " ".join(part for part in (rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS),
                                      rng.choice(PLACES)) if part) + " ."


def main() -> None:
    rng = random.Random(0)
    lines, count = [], 0
    while count < WORDS:
        lines.append(sentence(rng))
        count += len(lines[-1].split()) + 1  # WikiText2's tokenizer adds <eos> at each line end
    Path("data").mkdir(exist_ok=True)
    Path("data/wikitext-2.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
