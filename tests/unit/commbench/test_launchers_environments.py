"""commbench/launchers.py: reading rank and rendezvous from torchrun, SLURM and MPI environments; a broken
variable is one line naming it (exit 2)."""
import pytest
from conftest import clean_env, commbench

from commbench.launchers import LaunchError, detect_launcher, expand_hostlist, first_count, from_environment

TORCHRUN = {"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1",
            "MASTER_ADDR": "node01", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "abc"}
SLURM = {"SLURM_PROCID": "13", "SLURM_NTASKS": "32", "SLURM_LOCALID": "5", "SLURM_NODEID": "1",
         "SLURM_NNODES": "4", "SLURM_STEP_NUM_NODES": "4", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "123456",
         "SLURM_STEP_NODELIST": "gpu[07-08,10],gpu12", "SLURM_STEP_TASKS_PER_NODE": "8(x4)"}
OMPI = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}


def test_torchrun():
    assert detect_launcher(TORCHRUN) == "torchrun"
    info = from_environment(TORCHRUN, "torchrun")
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (9, 16, 1, 8)
    assert (info.node_rank, info.nnodes, info.master_addr, info.master_port) == (1, 2, "node01", 29400)


def test_slurm_srun():
    assert detect_launcher(SLURM) == "slurm"
    info = from_environment(SLURM, "slurm")
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (13, 32, 5, 8)
    assert (info.node_rank, info.nnodes) == (1, 4)
    assert info.master_addr == "gpu07"  # first host of the step's node list
    assert info.master_port == 10000 + 123456 % 20000  # same on every rank, derived from the job id


def test_slurm_master_override_and_batch_script():
    assert from_environment({**SLURM, "MASTER_ADDR": "head", "MASTER_PORT": "1234"}, "slurm").master_addr == "head"
    batch = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"}
    assert detect_launcher(batch) is None  # an sbatch script itself is one process, not a job step


def test_open_mpi_single_node_defaults_to_loopback():
    assert detect_launcher(OMPI) == "mpi"
    info = from_environment(OMPI, "mpi")
    assert (info.rank, info.world_size, info.local_rank, info.nnodes, info.master_addr) == (3, 4, 3, 1, "127.0.0.1")


def test_open_mpi_multi_node_needs_master_addr():
    env = {**OMPI, "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}
    with pytest.raises(LaunchError, match="MASTER_ADDR"):
        from_environment(env, "mpi")
    info = from_environment({**env, "MASTER_ADDR": "n1"}, "mpi")
    assert (info.nnodes, info.node_rank, info.master_addr) == (2, 0, "n1")


def test_mpich_hydra():
    env = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}
    assert detect_launcher(env) == "mpi"
    info = from_environment(env, "mpi")
    assert (info.rank, info.world_size, info.local_rank) == (2, 4, 2)


def test_no_launcher_and_bad_values():
    assert detect_launcher({"HOME": "/root"}) is None
    with pytest.raises(LaunchError, match="SLURM_NTASKS"):
        from_environment({**SLURM, "SLURM_NTASKS": "many"}, "slurm")


@pytest.mark.parametrize("hostlist,hosts", [
    ("node1", ["node1"]),
    ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
    ("gpu[07-08,10],cpu5", ["gpu07", "gpu08", "gpu10", "cpu5"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
])
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


def test_tasks_per_node():
    assert first_count("8(x4)") == 8 and first_count("2,1") == 2


MPICH = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}


@pytest.mark.parametrize("base,change,named", [
    (TORCHRUN, {"MASTER_PORT": "abc"}, "MASTER_PORT='abc' is not an integer"),
    (TORCHRUN, {"MASTER_PORT": "99999"}, "MASTER_PORT=99999 is not a TCP port"),
    (TORCHRUN, {"LOCAL_WORLD_SIZE": "x"}, "LOCAL_WORLD_SIZE='x' is not an integer"),
    (TORCHRUN, {"WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
    (TORCHRUN, {"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE=0 must be at least 1"),
    (TORCHRUN, {"RANK": "16"}, "RANK=16 must be below WORLD_SIZE=16"),
    (TORCHRUN, {"RANK": "-1"}, "RANK=-1 must be at least 0"),
    (TORCHRUN, {"LOCAL_RANK": "8"}, "LOCAL_RANK=8 must be below LOCAL_WORLD_SIZE=8"),
    (TORCHRUN, {"LOCAL_WORLD_SIZE": "32"}, "LOCAL_WORLD_SIZE=32 is more than WORLD_SIZE=16"),
    (SLURM, {"SLURM_NNODES": "x", "SLURM_STEP_NUM_NODES": "x"}, "SLURM_STEP_NUM_NODES='x' is not an integer"),
    ({k: v for k, v in SLURM.items() if k != "SLURM_STEP_NUM_NODES"}, {"SLURM_NNODES": "0"},
     "SLURM_NNODES=0 must be at least 1"),
    (SLURM, {"SLURM_STEP_NODELIST": "node[a-b]"}, "SLURM_STEP_NODELIST='node[a-b]' is not a SLURM host list"),
    (SLURM, {"SLURM_STEP_NODELIST": "node[1-"}, "SLURM_STEP_NODELIST='node[1-' is not a SLURM host list"),
    (SLURM, {"SLURM_PROCID": "32"}, "SLURM_PROCID=32 must be below SLURM_NTASKS=32"),
    (OMPI, {"OMPI_COMM_WORLD_SIZE": "0"}, "OMPI_COMM_WORLD_SIZE=0 must be at least 1"),
    (MPICH, {"MPI_LOCALNRANKS": "x"}, "MPI_LOCALNRANKS='x' is not an integer"),
    (MPICH, {"MPI_LOCALNRANKS": "0"}, "MPI_LOCALNRANKS=0 must be at least 1"),
])
def test_broken_launcher_variables_name_the_variable(base, change, named):
    env = {**base, **change}
    with pytest.raises(LaunchError, match=named.replace("[", r"\[").replace("]", r"\]")):
        from_environment(env, detect_launcher(env))


@pytest.mark.parametrize("env", [
    {"RANK": "5", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"},
    {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0", "SLURM_NNODES": "0",
     "SLURM_NODELIST": "n1"},
])
def test_broken_launcher_variables_are_one_line_and_exit_2(env):
    proc = commbench("sweep", "--sizes", "1K", env=clean_env(**env), timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "launcher variable" in proc.stderr
