"""The fast tokenizer class of hf_relpos' trained tokenizers: the named special tokens are control tokens that text
never spells, the extra special tokens (language tags) are read from text.

SentencePiece encodes a "</s>" written in a sentence as its characters; `split_special_tokens` does the same here. The
tokenizers library ties that to the flag that also makes `decode(..., skip_special_tokens=True)` drop a token (its
`special`): with `split_special_tokens` alone, every token added with `add_special_tokens` would be encoded as its
characters too, so a tag such as ">>deu<<" would never be its id. This class keeps the flag for the named special
tokens only (`bos_token`, `eos_token`, `unk_token`, `pad_token`, ...: `special_tokens_map`) and adds every other
special token (`extra_special_tokens`, or a token added with `add_tokens(..., special_tokens=True)`) to the backend as
a token read from text; decoding with `skip_special_tokens=True` drops those itself."""

from __future__ import annotations

import json
from typing import Any

from transformers import AddedToken, TokenizersBackend


class RelPosTokenizer(TokenizersBackend):
    """A `TokenizersBackend` whose extra special tokens are one id each wherever the text spells them and are dropped
    by `decode(..., skip_special_tokens=True)`, while text that spells a named special token ("</s>", "<pad>") is
    text under `split_special_tokens`."""

    # No __init__ of its own: transformers builds a class that defines one from the vocabulary alone (its
    # `convert_to_native_format`), not from tokenizer.json.

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> RelPosTokenizer:
        """As `TokenizersBackend.from_pretrained`; a tokenizer.json saved by another class, in which other special
        tokens than the named ones are special in the backend (never read from text), has them turned into tokens
        read from text (the backend cannot unmark a special token in place)."""
        tokenizer = super().from_pretrained(*args, **kwargs)
        named = tokenizer._named_special_tokens()
        spec = json.loads(tokenizer._tokenizer.to_str())
        # The backend's serialisation shows a token re-added as not special as such, while the backend still skips it.
        unnamed = [token for token in spec["added_tokens"] if token["content"] not in named]
        extras = {str(extra) for extra in tokenizer._extra_special_tokens}
        if any(token["special"] or token["content"] in extras for token in unnamed):
            for token in unnamed:
                if token["special"] and token["content"] not in extras:
                    tokenizer._extra_special_tokens.append(token["content"])
                token["special"] = False
            tokenizer._tokenizer = type(tokenizer._tokenizer).from_str(json.dumps(spec))
            tokenizer._tokenizer.encode_special_tokens = tokenizer.split_special_tokens
        return tokenizer

    def _named_special_tokens(self) -> set[str]:
        """The named special tokens (`special_tokens_map`'s), the control tokens text never spells."""
        return {str(token) for token in self._special_tokens_map.values() if token is not None}

    def _add_tokens(self, new_tokens: list[str | AddedToken], special_tokens: bool = False) -> int:
        """Named special tokens go to the backend as special (never read from text under `split_special_tokens`);
        every other token marked special (`special_tokens`, or an `AddedToken` with `special`) goes as a token read
        from text, and joins `extra_special_tokens` so that decoding can skip it."""
        named = self._named_special_tokens()
        control: list[str | AddedToken] = []
        written: list[str | AddedToken] = []
        for token in new_tokens:
            is_special = special_tokens or (isinstance(token, AddedToken) and token.special)
            if str(token) in named:
                control.append(token)
            elif is_special:
                written.append(_read_from_text(token))
                if str(token) not in {str(extra) for extra in self._extra_special_tokens}:
                    self._extra_special_tokens.append(str(token))
            else:
                written.append(token)
        added = self._tokenizer.add_special_tokens(control) if control else 0
        return added + (self._tokenizer.add_tokens(written) if written else 0)

    def _decode(self, token_ids: int | list[int], skip_special_tokens: bool = False, **kwargs: Any) -> str:
        """As `TokenizersBackend._decode`; with `skip_special_tokens`, the extra special tokens, which the backend
        does not know as special, are dropped too."""
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        if skip_special_tokens and isinstance(token_ids, list):
            skipped = set(self.all_special_ids)
            token_ids = [index for index in token_ids if int(index) not in skipped]
        return super()._decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)


def _read_from_text(token: str | AddedToken) -> AddedToken:
    """`token` as an added token the backend reads from text: matched in the text as written (not normalised), with
    its `single_word`, `lstrip` and `rstrip`, and not special."""
    if isinstance(token, str):
        return AddedToken(token, normalized=False, special=False)
    return AddedToken(token.content, single_word=token.single_word, lstrip=token.lstrip, rstrip=token.rstrip,
                      normalized=False, special=False)
