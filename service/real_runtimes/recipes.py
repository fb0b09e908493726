"""Every program ``make real-runtimes`` installs, in the order it installs them."""

from __future__ import annotations

from service.real_runtimes import piper_recipe, sdcpp_recipe, vllm_recipe, whispercpp_recipe
from service.real_runtimes.install import Recipe
from service.real_runtimes.llamacpp_recipe import LLAMA_CPP

RECIPES: tuple[Recipe, ...] = (
    LLAMA_CPP,
    whispercpp_recipe.RECIPE,
    sdcpp_recipe.RECIPE,
    vllm_recipe.RECIPE,
    piper_recipe.RECIPE,
)
