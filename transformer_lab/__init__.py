"""transformer-lab: a course kit that teaches Transformers with PyTorch Lightning.

The package holds the single implementation of every component the lecture teaches
(positional encodings, attention, masks, blocks, models, decoding), the Lightning
training layer, the nbgrader pipeline and the self-checks the notebooks call.

Importing the package does nothing heavy: submodules are imported where used.
"""

__version__ = "0.1.0"
