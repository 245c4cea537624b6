"""Print the tables of the diffusers families: the shipped families (README.md, "Supported diffusers models") and
the excluded rotary classes (docs/adding_a_family.md, "Coverage")."""

from . import markdown_table
from .coverage import exclusions_table

print(markdown_table())
print()
print(exclusions_table())
