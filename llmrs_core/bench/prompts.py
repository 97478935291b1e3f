"""The prompt set shipped with ``llmrs bench serve --dataset prompts`` (chapter 11): short questions.

Forty short, varied requests of the kind a small instruct model is asked,
10-30 tokens each with SmolLM2's tokenizer. They are sent as plain text to
``/v1/completions``; the benchmark gives each load level its own copy (a tag in
front), so a prefix cache cannot answer one level from another's prompts.
"""

from __future__ import annotations

PROMPTS: tuple[str, ...] = (
    "What are the three primary colours, and why are they called primary?",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about a cat watching the rain.",
    "Give me three tips for keeping a houseplant alive.",
    "What is the difference between a list and a tuple in Python?",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "How many minutes are there in a week? Show the calculation.",
    "Suggest a name for a bakery that sells only bread made with rye.",
    "What does a compiler do, in words a ten-year-old would understand?",
    "List four fruits that are rich in vitamin C.",
    "Why do leaves change colour in autumn?",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Write a short thank-you note to a neighbour who watered my garden.",
    "What is the boiling point of water at the top of a high mountain, and why is it lower?",
    "Describe a sunrise over the sea in three sentences.",
    "What is photosynthesis?",
    "Give a simple recipe for pancakes for two people.",
    "Why is it important to back up your files? Give two reasons.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Explain what a prime number is, with three examples.",
    "Write a limerick about a forgetful robot.",
    "How does a bicycle stay upright when it moves?",
    "What should I pack for a weekend hiking trip?",
    "Compare trains and planes for a 500 km journey.",
    "What is the Pythagorean theorem? Give an example with numbers.",
    "Tell me a fun fact about octopuses.",
    "How do I politely decline an invitation to a party?",
    "What causes the seasons on Earth?",
    "Write the opening line of a mystery novel set in a lighthouse.",
    "Explain the rules of tic-tac-toe.",
    "What is the difference between weather and climate?",
    "Give three ideas for a rainy-day activity with children.",
    "Why do we have leap years?",
    "Describe the taste of a lemon to someone who has never had one.",
    "What is a black hole, in one paragraph?",
    "How can I make my morning routine less rushed?",
    "Name five musical instruments and the family each belongs to.",
    "What is recursion? Give a short example in Python.",
    "Why do cats purr?",
    "Write a two-line poem about the moon.",
)

__all__ = ["PROMPTS"]
