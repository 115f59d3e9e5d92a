"""scripts/gluon_sass_hashes.py: a hash of a kernel's SASS instructions and their encodings (the
bytes, scheduling control bits included), blind to their addresses (what moves when code before
them changes length); the interpreter refused in one line. (Building every form takes minutes:
not run here.)"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from gluon_sass_hashes import sass_hash  # noqa: E402

SASS = """        /*0000*/                   MOV R1, c[0x0][0x28] ;                     /* 0x00000a0000017a02 */
        /*0010*/                   S2R R0, SR_TID.X ;                          /* 0x0000000000007919 */
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;  /* 0x0000000004187df0 */
"""


def test_the_hash_reads_instructions_and_encodings_not_addresses():
    moved = SASS.replace("/*0000*/", "/*0100*/").replace("/*0010*/", "/*0110*/").replace("/*0020*/", "/*0120*/")
    recoded = SASS.replace("0x0000000000007919", "0x000000000000791a")      # another stall count, say
    assert sass_hash(moved) == sass_hash(SASS) != sass_hash(SASS.replace("S2R R0", "S2R R2"))
    assert sass_hash(recoded) != sass_hash(SASS) and len(sass_hash(SASS)) == 12


def test_the_interpreter_is_refused_in_one_line(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gluon_sass_hashes.py"), str(tmp_path / "h.json")],
                         capture_output=True, text=True, env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin"},
                         timeout=120, cwd=ROOT)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1 and "TRITON_INTERPRET" in run.stderr
    assert not (tmp_path / "h.json").exists()
