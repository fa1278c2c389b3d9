"""`import mixtrain`: the package loads under the torch it was built for and reports both
versions; under any other torch it refuses with one ImportError naming both versions, before
its C++ module is loaded (a module built against one torch's libraries must not run against
another's), and the process exits normally (no crash).
"""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import oracle_util as util  # noqa: E402


def check_loads(check):
    import torch

    import mixtrain

    check.expect(mixtrain.torch_version == torch.__version__,
                 f"built for torch {mixtrain.torch_version}, running {torch.__version__}")
    check.expect(mixtrain._C.torch_version == torch.__version__, "the C++ module's torch version")
    check.expect(mixtrain._C.version == mixtrain.__version__, "the C++ module's own version")
    import mixtrain.optim  # noqa: F401


def check_refuses_other_torch(check):
    """A stand-in `torch` package of another version first on the path."""
    import mixtrain

    with tempfile.TemporaryDirectory(prefix="mixtrain-faketorch-") as directory:
        os.makedirs(os.path.join(directory, "torch"))
        with open(os.path.join(directory, "torch", "__init__.py"), "w") as f:
            f.write('__version__ = "2.10.0+other"\n')
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(mixtrain.__file__)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([directory, package_root]))
        result = subprocess.run([sys.executable, "-c", "import mixtrain.optim"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                timeout=60)
    out = result.stdout
    check.expect(result.returncode == 1, f"exit status {result.returncode} (1 expected):\n{out}")
    check.expect("ImportError" in out and "2.10.0+other" in out and
                 mixtrain.torch_version in out,
                 f"the message does not name both versions:\n{out}")
    check.expect("Segmentation" not in out and "undefined symbol" not in out,
                 f"the C++ module was loaded:\n{out}")


def main():
    args, check = util.start(__doc__.splitlines()[0])
    del args
    check_loads(check)
    check_refuses_other_torch(check)
    check.finish()


if __name__ == "__main__":
    main()
