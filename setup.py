"""Installs the maxtext RL post-training package (src/ layout)."""

from setuptools import find_packages, setup

with open("requirements.txt", encoding="utf-8") as f:
  requirements = [line.strip() for line in f if line.strip() and not line.startswith("#")]

setup(
    name="maxtext-rl",
    version="0.1.0",
    description="MaxText-style GRPO post-training for Qwen3 and Llama models in JAX, on Tunix.",
    package_dir={"": "src"},
    packages=find_packages("src"),
    package_data={"maxtext": ["configs/*.yml", "configs/*/*.yml", "configs/templates/*.json", "configs/chat_templates/*.jinja"]},
    python_requires=">=3.11",
    install_requires=requirements,
)
