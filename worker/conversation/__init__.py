"""One conversation regenerated on policy, turn by turn, on the shared engine.

In the order a batch's rows pass through::

    generation.py  a batch on the engine: each conversation once admitted, each turn on policy
    rendering.py   the model's own chat template, to token ids (and the run's parsers back)
    dialogue.py    one conversation: generate a turn, parse it (targets/turn_parsers.py),
                   splice the source's tool results, until the conversation ends
"""
