"""A fixed vocabulary for synthesized names, so generated tasks are reproducible from their seed alone."""

from __future__ import annotations

import random

VOCAB = tuple(["amber", "anchor", "apple", "arch", "arrow", "aspen", "atlas", "badge", "bamboo", "basin", "beacon", "birch", "blaze", "bloom", "bolt", "border", "breeze", "brick", "bridge", "brook", "cabin", "cactus", "candle", "canyon", "carbon", "cargo", "cedar", "chalk", "charm", "cider", "cinder", "citrus", "cliff", "clover", "cobalt", "comet", "copper", "coral", "cotton", "crane", "crest", "crystal", "dawn", "delta", "denim", "dune", "eagle", "ember", "falcon", "fern", "fjord", "flint", "forge", "fossil", "frost", "galaxy", "garnet", "geyser", "ginger", "glacier", "granite", "gravel", "harbor", "hazel", "heron", "hollow", "honey", "horizon", "indigo", "iris", "ivory", "jade", "jasper", "juniper", "kelp", "kernel", "lagoon", "lantern", "lava", "ledger", "lemon", "lilac", "linen", "lotus", "lunar", "maple", "marble", "meadow", "mesa", "meteor", "mint", "mosaic", "moss", "nectar", "nickel", "nimbus", "nova", "oak", "oasis", "olive", "onyx", "opal", "orbit", "orchid", "otter", "paddle", "pebble", "pepper", "pine", "pixel", "plasma", "plume", "polar", "poppy", "prairie", "prism", "pulse", "quartz", "quill", "radar", "raven", "reef", "ridge", "river", "robin", "rocket", "saffron", "sage", "salt", "sapphire", "scarlet", "shadow", "shale", "signal", "silver", "slate", "spark", "spruce", "summit", "sunset", "tango", "thistle", "thunder", "tide", "timber", "topaz", "torch", "tulip", "tundra", "valley", "velvet", "violet", "walnut", "willow", "wren", "yarrow", "zephyr", "zinc"])


def word(rng: random.Random) -> str:
    return rng.choice(VOCAB)


def words(rng: random.Random, n: int) -> list[str]:
    """n distinct words."""
    return rng.sample(VOCAB, n)
