"""Shared test setup: quiet TensorFlow logs and headless rendering before TF/MuJoCo import."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MUJOCO_GL", "egl")
