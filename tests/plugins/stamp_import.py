"""A module that writes when (and in which process) it is imported: ``needs_stamp`` names it in its warm_imports."""

from tests.plugins.preload_checks import stamp

stamp("import.stamp")
