"""SoftwareDev-style one-line software ideas for the `-full` MetaGPT workloads, written for this
project (MetaGPT's SoftwareDev set is 70 such one-liners; none is copied here).

Each idea carries its length in cl100k_base tokens, counted once with tiktoken's cl100k_base in
the MetaGPT venv (the encoding docs/metagpt-facts.md's figures use). A task draws one idea
uniformly; its token count is the task's input segment, so the idea's length drives the input
tokens.
"""

from __future__ import annotations

import numpy as np

#: (idea, cl100k_base tokens)
IDEAS: tuple[tuple[str, int], ...] = (
    ("Write a 2048 sliding-tile game that runs in the terminal", 14),
    ("Build a snake game with a score board and increasing speed", 11),
    ("Create a command-line todo list manager that stores tasks in a JSON file", 14),
    ("Make a Flappy Bird style game using pygame", 9),
    ("Write a Markdown to HTML converter with support for tables and code blocks", 13),
    ("Build a tic-tac-toe game with an unbeatable computer opponent", 14),
    ("Create a simple web-based calculator with a history of past results", 12),
    ("Write a password generator with options for length, digits and symbols", 12),
    ("Build a Pomodoro timer with desktop notifications and daily statistics", 12),
    ("Create a CLI tool that finds duplicate files in a directory tree", 12),
    ("Write a Tetris clone with a preview of the next piece and level progression", 15),
    ("Build a weather dashboard that reads a CSV of measurements and plots trends", 13),
    ("Create a URL shortener service with a small REST API", 11),
    ("Write a Sudoku solver and generator with three difficulty levels", 10),
    ("Build a minesweeper game with a configurable board size", 11),
    ("Create a personal expense tracker that exports monthly reports", 9),
    ("Write a chess move validator that reads games in PGN format", 12),
    ("Build a text adventure game engine driven by a YAML story file", 12),
    ("Create a Pong game for two players on one keyboard", 11),
    ("Write a log file analyzer that reports the most frequent errors per hour", 13),
    ("Build a flashcard app for learning vocabulary with spaced repetition", 11),
    ("Create a recipe manager that scales ingredient quantities by servings", 10),
    ("Write a Conway's Game of Life simulator with a pattern library", 12),
    ("Build a quiz application that loads questions from a JSON file and keeps high scores", 15),
    ("Create a file encryption tool using a password-derived key", 10),
    ("Write a maze generator and solver that draws the path in the terminal", 13),
    ("Build a simple blog engine that renders posts from Markdown files", 11),
    ("Create a stopwatch and countdown timer with lap times", 9),
    ("Write a unit converter for length, weight, temperature and volume", 12),
    ("Build a Breakout game with power-ups and multiple levels", 11),
    ("Create a contact book with search, import and export to CSV", 12),
    ("Write a simple spreadsheet that evaluates formulas referencing other cells", 10),
    ("Build a typing speed test that measures words per minute and accuracy", 12),
    ("Create a hangman game with word categories and hints", 10),
    ("Write a budget planner that warns when a category goes over its limit", 13),
    ("Build a music playlist manager that shuffles without repeating artists", 11),
    ("Create a library book lending system with due dates and fines", 11),
    ("Write a space invaders game with shields and a high score table", 12),
    ("Build a habit tracker that shows streaks on a calendar view", 12),
    ("Create an inventory system for a small shop with low-stock alerts", 12),
)


def sample_idea(rng: np.random.Generator) -> tuple[str, int]:
    """One idea, drawn uniformly: ``(text, tokens)``."""
    return IDEAS[int(rng.integers(len(IDEAS)))]


def delay_s(rng: np.random.Generator, ms: tuple[int, int]) -> float:
    """A non-LLM gap drawn uniformly from an inclusive range in milliseconds, in seconds."""
    return float(rng.uniform(ms[0], ms[1])) / 1000.0
