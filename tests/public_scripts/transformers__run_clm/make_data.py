"""Writes what the script reads, offline: `train.txt` (the text it trains on), `tokenizer/` (a tokenizer it
loads with `--tokenizer_name tokenizer`) and `config/` (a two-layer GPT-2 configuration it can load with
`--config_name config`).

The text is sentences from a small grammar (subject, verb, object, an optional place), drawn with a fixed
seed, one sentence a line: a language model has structure to learn, and every run sees the same text.
The tokenizer is a word-level one built here with the `tokenizers` library over that text (every word
of the grammar, plus `<|endoftext|>` and `[UNK]`), so nothing is downloaded from the Hugging Face Hub.
"""

import random
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, PreTrainedTokenizerFast

SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the teacher", "a bird", "the farmer", "our neighbour"]
VERBS = ["sees", "likes", "feeds", "follows", "paints", "finds", "carries", "watches"]
OBJECTS = ["the ball", "a red apple", "the small boat", "a letter", "the garden", "some bread", "the old map"]
PLACES = ["", "", " in the park", " at home", " near the river", " after school", " on the hill"]
SENTENCES = 3000


def sentence(rng: random.Random) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(PLACES)} ."


def main() -> None:
    rng = random.Random(0)
    text = "".join(sentence(rng) + "\n" for _ in range(SENTENCES))
    Path("train.txt").write_text(text)

    words = sorted(set(text.split()))
    vocab = {word: index for index, word in enumerate(["<|endoftext|>", "[UNK]", *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>", model_max_length=64)
    fast.save_pretrained("tokenizer")

    GPT2Config(vocab_size=len(vocab), n_positions=64, n_embd=32, n_layer=2, n_head=2,
               bos_token_id=0, eos_token_id=0).save_pretrained("config")


if __name__ == "__main__":
    main()
