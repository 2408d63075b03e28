"""Writes `data/tok64/shard_00.bin` .. `shard_03.bin`, the pretokenized shards llama2.c's train.py reads
with `--vocab_source=custom --vocab_size=64` (uint16 token ids, as its tinystories.py writes them),
offline. The script holds out the first shard for validation and trains on the others.

Not TinyStories: sentences from a small grammar, drawn with a fixed seed, each word one token of a
64-token vocabulary (token 0 the separator before each sentence, as BOS is in llama2.c's shards), so a
language model has structure to learn and every run sees the same tokens.
"""

import random
from pathlib import Path

import numpy as np

SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the teacher", "a bird", "the farmer", "our neighbour"]
VERBS = ["sees", "likes", "feeds", "follows", "paints", "finds", "carries", "watches"]
OBJECTS = ["the ball", "a red apple", "the small boat", "a letter", "the garden", "some bread", "the old map"]
PLACES = ["", "", "in the park", "at home", "near the river", "after school", "on the hill"]
SHARDS, TOKENS_PER_SHARD, VOCAB = 4, 20_000, 64


def main() -> None:
    words = sorted({w for part in SUBJECTS + VERBS + OBJECTS + PLACES for w in part.split()} | {"."})
    ids = {word: index + 1 for index, word in enumerate(words)}
    assert len(ids) < VOCAB
    rng = random.Random(0)
    folder = Path("data") / f"tok{VOCAB}"
    folder.mkdir(parents=True, exist_ok=True)
    for shard in range(SHARDS):
        tokens: list[int] = []
        while len(tokens) < TOKENS_PER_SHARD:
            sentence = " ".join(p for p in (rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS),
                                            rng.choice(PLACES)) if p) + " ."
            tokens += [0, *(ids[w] for w in sentence.split())]
        np.array(tokens, dtype=np.uint16).tofile(folder / f"shard_{shard:02d}.bin")


if __name__ == "__main__":
    main()
