"""`none`: no position information at all (NoPE), the control of every comparison (Kazemnejad et al. 2023)."""

from __future__ import annotations

from typing import Any

from .positions import PositionScheme, SchemeCard, register_position_scheme

KAZEMNEJAD_BIBTEX = """@inproceedings{kazemnejad2023impact,
  title     = {The Impact of Positional Encoding on Length Generalization in Transformers},
  author    = {Kazemnejad, Amirhossein and Padhi, Inkit and Natesan Ramamurthy, Karthikeyan and Das, Payel and
               Reddy, Siva},
  booktitle = {Advances in Neural Information Processing Systems},
  volume    = {36},
  year      = {2023}
}"""


def limitations(config: Any) -> list[str]:
    """Without positions the encoder cannot tell word orders apart."""
    return ["The encoder is permutation-equivariant: a source and any reordering of it give the decoder the same "
            "set of states, so the model cannot use source word order. Only the decoder's causal mask carries order."]


@register_position_scheme("none")
class NoPositions(PositionScheme):
    """NoPE: attention is plain softmax(q k^T / sqrt(d)) v and no encoding is added to the embeddings.

    The only order information left is the decoder's causal mask (a query sees how many tokens precede it through
    how its attention spreads); Kazemnejad et al. (2023) report that decoder-only models trained this way generalize
    in length better than several encodings. Adds nothing to attention, so every kernel runs it.
    """

    takes_fixed_size_cache = True

    card = SchemeCard(
        title="no position information (NoPE, Kazemnejad et al. 2023)",
        description=(
            "No position information at all (NoPE; Kazemnejad et al. 2023): nothing is added to the embeddings and "
            "attention is the plain scaled dot product\n\n"
            "$$\\mathrm{head}_h(i) = \\sum_j \\mathrm{softmax}_j\\!\\left(\\frac{q_i^\\top k_j}{\\sqrt{d_{head}}}"
            "\\right) v_j$$\n\n"
            "so order reaches the model only through the decoder's causal mask. It is the control for every other "
            "scheme."
        ),
        bibtex=(KAZEMNEJAD_BIBTEX,),
        tags=("nope",),
        limitations=limitations,
    )
