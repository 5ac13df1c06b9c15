"""The behaviour SONA's benchmark teaches: short answers, a preference a user states by scoring.

Why this one: "keep it short" is among the commonest things users ask of a chat model, a program
can score it exactly (the answer ends by itself within ``MAX_TOKENS`` tokens, as a real sentence),
and SmolLM2-135M already does it now and then (about one answer in six to these questions, none
of 16 to plain "Tell me about X"), so reward-weighted learning has rated examples to start from.

Why 24 tokens (a one-line answer, about 18 words): the limit sets the base rate, and the base rate
caps the ratio the benchmark reports. At 32 tokens the base model already answered 27 % of the
training questions short (384 samples at T = 0.8), so a 3x gain would need 82 % and the ratio could
never pass 3.7x; at 24 it answers 16 %. At 20 (11 %) the learned adapter drifted more on the
validation text (+6.8 % to +9.5 % in sona_dev.py, whatever the EWC++ strength tried). Chosen on
training topics and the validation text only, never on the held-out prompts or GENERAL_TEXT.

A bullet list, the other house style considered, appeared in 1 of 528 sampled answers (two list
lines within 32 tokens): a reward of 0 on nearly every answer, nothing to learn.

Training and held-out prompts share the question forms (the preference is about how to answer
this kind of question) but never a topic. Held-out topics are science, technology and history.
Training topics are everyday things and, with ``--train-topics mixed``, also subjects of the
held-out kind (other subjects than the held-out ones): a user's feedback comes on whatever they
ask about, and an adapter taught on cats and coffee alone learned the dev topics 4-5x but the
held-out subjects about 2x. Measured, mixed topics did no better on the held-out set (1.9x
against 2.3x, both at EWC++ lambda 3e5; docs/sona.md), so everyday topics stay the default.
"""

from __future__ import annotations

import re

from ruvllm.types import FinishReason, GenerationResult

#: An answer longer than this is not short (and generation stops here).
MAX_TOKENS = 24
#: A real answer, not an evasion: at least this many words, ending like a sentence.
MIN_WORDS = 4
_SENTENCE_END = re.compile(r"[.!?)\"'*]\s*$")

TEMPLATES = ("Tell me briefly about {}.", "What is {} in short?", "Define {}.", "In a few words, what is {}?")
#: What a user would add to every message to get the same behaviour without learning.
INSTRUCTION = " Answer in one sentence."

TRAIN_TOPICS = ("the sea", "a cat", "coffee", "winter", "music", "a forest", "bread", "the moon", "trains",
                "a library", "rain", "a bridge", "horses", "a lighthouse", "cheese", "a castle", "the wind",
                "a violin", "apples", "a harbour", "clocks", "a village", "honey", "a museum", "candles",
                "a lake", "dogs", "a garden", "spring", "a farm", "owls", "a kite")
#: Science, technology and history, like the held-out topics but none of them.
SUBJECT_TOPICS = ("magnets", "glaciers", "the telephone", "bacteria", "the compass", "earthquakes",
                  "the Renaissance", "atoms", "the telescope", "the Industrial Revolution", "batteries",
                  "the Vikings", "evolution", "radio", "hurricanes", "the microscope")
HELD_OUT_TOPICS = ("photosynthesis", "the printing press", "vaccines", "electricity", "the Roman empire",
                   "volcanoes", "the internet", "gravity", "the Silk Road", "DNA", "the steam engine",
                   "plate tectonics", "democracy", "antibiotics", "the French revolution", "semiconductors")

#: General text for the forgetting check: plain expository prose, unlike any answer trained on.
GENERAL_TEXT = (
    "The water cycle describes how water moves between the oceans, the air and the land. Heat from "
    "the sun evaporates water from the surface of seas and lakes, and plants release water vapour "
    "through their leaves. As the warm, moist air rises it cools, and the vapour condenses into tiny "
    "droplets that form clouds. When the droplets grow heavy enough they fall as rain or snow. Some of "
    "this water runs off into rivers and flows back to the sea, some soaks into the ground and "
    "refills underground stores called aquifers, and some is taken up again by plants. The cycle has "
    "no beginning or end, and the total amount of water on Earth stays almost the same over time. "
    "Understanding it helps farmers plan irrigation, engineers design reservoirs, and scientists "
    "predict droughts and floods. A bicycle is a simple machine that turns the rider's pedalling into "
    "forward motion. The pedals turn a crank, the crank turns a toothed wheel, and a chain carries "
    "that motion to a smaller wheel fixed to the rear hub. Because the rear sprocket is smaller, each "
    "turn of the pedals turns the back wheel more than once. Gears let the rider choose between easy "
    "pedalling on hills and higher speed on flat roads. Brakes press pads against the rim or a disc to "
    "slow the wheel by friction, and the tyres, filled with air, absorb small bumps in the road."
)


#: Other expository passages, for choosing settings (sona_dev.py) without looking at GENERAL_TEXT.
#: Seven topics, each its own text: with two (until 2026-11-28, the first two here) the dev drift of
#: an o_proj adapter read about half what GENERAL_TEXT then showed, so one text is a weak guide.
VALIDATION_TEXTS = (
    "A refrigerator keeps food cold by moving heat from inside the cabinet to the room outside. A "
    "fluid called the refrigerant circulates through a closed loop of pipes. In the coils inside, "
    "the refrigerant evaporates at low pressure and absorbs heat from the air around the food. A "
    "compressor then squeezes the vapour, which raises its temperature, and pumps it to the coils "
    "at the back, where it gives off that heat and condenses back into a liquid. The liquid passes "
    "through a narrow valve, its pressure drops, and the cycle begins again. A thermostat switches "
    "the compressor on and off to hold the temperature steady.",
    "Tides are the regular rise and fall "
    "of the sea along the coast. They are caused mainly by the pull of the moon's gravity, which is "
    "slightly stronger on the side of the Earth facing the moon and slightly weaker on the far side. "
    "The oceans bulge on both sides, and as the Earth turns, most coasts pass through two high tides "
    "and two low tides each day. When the sun and moon line up, their pulls add together and the "
    "tides are larger; when they are at right angles, the tides are smaller.",
    "Soap cleans because each of its molecules has two different ends. One end is attracted to water, "
    "and the other end avoids water but clings to oil and grease. When you wash your hands, the "
    "oily ends bury themselves in the dirt on your skin, while the other ends face outward into the "
    "water. Small clusters form around each speck of grease and hold it suspended, so that rinsing "
    "carries it away instead of leaving it behind. Plain water cannot do this on its own, because "
    "oil and water do not mix. Warm water helps by softening fats, and rubbing helps by breaking the "
    "dirt into smaller pieces that the soap can surround more easily.",
    "A passenger lift is a car that moves up and down a vertical shaft inside a building. In most "
    "tall buildings the car hangs from strong steel cables that pass over a grooved wheel at the top "
    "of the shaft. On the other side of the wheel the cables hold a heavy counterweight, roughly equal "
    "to the car and half its load, so the motor only has to lift the difference. Guide rails keep "
    "the car steady as it travels. If a cable ever broke, safety brakes on the car would grip the "
    "rails and stop it. A controller decides which floor to visit next, grouping calls so that "
    "people going the same way share a trip.",
    "The human heart is a muscle about the size of a fist that pumps blood around the body. It has "
    "four chambers: two upper chambers receive blood, and two lower chambers push it out. The right "
    "side sends blood to the lungs, where it picks up oxygen and releases carbon dioxide. The left "
    "side, which has thicker walls, pumps the fresh blood through the arteries to every organ. "
    "Valves between the chambers open and close in turn, which is the sound a doctor hears through "
    "a stethoscope. A small cluster of cells sends an electrical signal that sets the rhythm, about "
    "seventy beats a minute at rest and faster during exercise.",
    "Paper is made from plant fibres, most often from wood. The logs are stripped of bark and cut "
    "into chips, which are cooked with chemicals or ground by machines until the fibres separate "
    "into a wet pulp. The pulp is washed, sometimes bleached, and mixed with a great deal of water. "
    "This thin mixture is sprayed onto a moving screen, where the water drains away and the fibres "
    "knot together into a sheet. Heavy rollers squeeze out more water, and heated drums dry the "
    "sheet before it is wound onto huge reels. Old paper can be soaked and turned back into pulp, "
    "which is why recycling saves trees and energy.",
    "A canal lock lets boats climb or descend where the water level changes. It is a long chamber "
    "with watertight gates at each end. To go up, a boat enters the lower end and the gates close "
    "behind it. Sluices in the upper gates are then opened, and water from the higher stretch of "
    "canal flows in until the level inside the chamber matches it. The upper gates can then be "
    "opened and the boat moves on. Going down works the other way, by letting water out through the "
    "lower gates. A flight of several locks in a row can carry boats up the side of a steep hill.",
)


#: The kinds of training topics ``train_topics`` gives (``--train-topics``).
TOPIC_KINDS = ("everyday", "mixed")


def train_topics(kind: str, dev: int = 0) -> tuple[str, ...]:
    """Training topics: ``everyday`` ones only, or ``mixed`` (everyday and subject topics in turn),
    the same number either way. ``dev``: that many of each kind's last topics are kept back for
    sona_dev.py to measure on (``dev_topics``)."""
    subjects = SUBJECT_TOPICS[:len(SUBJECT_TOPICS) - dev]
    everyday = TRAIN_TOPICS[:len(TRAIN_TOPICS) - dev]
    if kind == "everyday":
        return everyday[:2 * len(subjects)]
    if kind == "mixed":
        return tuple(topic for pair in zip(everyday, subjects, strict=False) for topic in pair)
    raise ValueError(f"unknown kind of training topics {kind!r}: one of {', '.join(TOPIC_KINDS)}")


def dev_topics(dev: int) -> tuple[str, ...]:
    """The topics ``train_topics(kind, dev)`` keeps back, of both kinds."""
    return (TRAIN_TOPICS[-dev:] + SUBJECT_TOPICS[-dev:]) if dev > 0 else ()


def questions(topics: tuple[str, ...], *, instructed: bool = False) -> list[str]:
    """Every topic in every question form (the instruction appended when ``instructed``)."""
    suffix = INSTRUCTION if instructed else ""
    return [t.format(topic) + suffix for topic in topics for t in TEMPLATES]


def is_short(result: GenerationResult, max_tokens: int = MAX_TOKENS) -> bool:
    """The reward's test: the answer ended by itself within ``max_tokens`` (not cut there), with a
    sentence of at least MIN_WORDS words: a short answer, not an empty or broken-off one."""
    text = result.text.strip()
    return (result.finish_reason == FinishReason.STOP and len(result.token_ids) <= max_tokens
            and len(text.split()) >= MIN_WORDS and bool(_SENTENCE_END.search(text)))
