package settings

import "time"

// hv is Horovod's spelling of a kolo name.
func hv(name string) []string { return []string{"HOROVOD_" + name[len("KOLO_"):]} }

// The engine's settings (engine.ConfigFromEnv), in the README's order. Defaults are declared
// here once; engine.DefaultConfig holds the same values as Go values.
var (
	FusionThreshold = engine(&Setting{Name: "KOLO_FUSION_THRESHOLD", Kind: Bytes, Default: "128 MiB", Flag: "--fusion-threshold-mb",
		Help: "fuse ready tensors up to this size (0: no fusion)"})
	CycleTime = engine(&Setting{Name: "KOLO_CYCLE_TIME", Kind: Duration, Unit: time.Millisecond, Default: "0", Flag: "--cycle-time-ms",
		Help: "wait to batch more tensors before negotiating (a bare number is milliseconds)"})
	CacheCapacity = engine(&Setting{Name: "KOLO_CACHE_CAPACITY", Kind: Count, Default: "1024", Flag: "--cache-capacity",
		Help: "response cache entries (0: no cache)"})
	StallCheckTime = engine(&Setting{Name: "KOLO_STALL_CHECK_TIME_SECONDS", Kind: Duration, Unit: time.Second, Default: "60", Flag: "--stall-check-warning-time-seconds",
		Help: "report ops some ranks submitted and others did not after this long, naming the missing ranks"})
	StallShutdownTime = engine(&Setting{Name: "KOLO_STALL_SHUTDOWN_TIME_SECONDS", Kind: Duration, Unit: time.Second, Default: "1800", Flag: "--stall-check-shutdown-time-seconds",
		Help: "fail such ops after this long (0: never)"})
	StallCrossedTime = engine(&Setting{Name: "KOLO_STALL_CROSSED_TIME_SECONDS", Kind: Duration, Unit: time.Second, Default: "30", Flag: "--stall-check-crossed-time-seconds",
		Help: "fail sooner ops whose ranks went different ways (0: never)"})
	ProgressTimeout = engine(&Setting{Name: "KOLO_PROGRESS_TIMEOUT_SECONDS", Kind: Duration, Unit: time.Second, Default: "60", Flag: "--progress-timeout-seconds",
		Help: "fail a collective (or a wait on the coordinator) on a peer that makes no progress, naming it (0: never)"})
	StallCheckDisable = engine(&Setting{Name: "KOLO_STALL_CHECK_DISABLE", Kind: Bool, Default: "false", Flag: "--no-stall-check",
		Help: "turn the stall inspector (its warnings and both deadlines) off"})
	HierarchicalAllreduce = engine(&Setting{Name: "KOLO_HIERARCHICAL_ALLREDUCE", Kind: Bool, Default: "on", Flag: "--hierarchical-allreduce",
		Help: "two-level allreduce (shm within a host, TCP across) when hosts run equal numbers of ranks; `0` turns it off"})
	HierarchicalAllgather = engine(&Setting{Name: "KOLO_HIERARCHICAL_ALLGATHER", Kind: Text, Flag: "--hierarchical-allgather",
		Help: "accepted for compatibility; kolo's allgather has no hierarchical variant"})
	ShmStreamStores = engine(&Setting{Name: "KOLO_SHM_STREAM_STORES", Kind: Choice, Choices: []string{"1", "true", "on", "0", "false", "off", "auto"}, Default: "auto",
		Help: "how the shared-memory collectives write what another core reads: `1` streaming (non-temporal) stores, `0` plain ones; by default each host's group times both on its first shared collective and keeps the faster"})
	SmallAllreduceBytes = engine(&Setting{Name: "KOLO_SMALL_ALLREDUCE_BYTES", Kind: Bytes, Default: "64KiB",
		Help: "allreduces shorter than this use recursive doubling, longer ones the shared-memory slots or the ring; rank 0's value counts; `--autotune` may change it"})
	ShmRoundBytes = engine(&Setting{Name: "KOLO_SHM_ROUND_BYTES", Kind: Bytes, Default: "1MiB",
		Help: "what the shared-memory collectives move per rank between barriers when every rank has a CPU; rank 0's value counts; `--autotune` may change it"})
	StartTimeout = engine(&Setting{Name: "KOLO_START_TIMEOUT", Kind: Duration, Unit: time.Second, Default: "60",
		Help: "how long connecting to the peers may take"})
	SpinTime = engine(&Setting{Name: "KOLO_SPIN_TIME", Kind: Duration, Unit: time.Microsecond, Default: "50 us (0 when ranks outnumber cores)",
		Help: "how long waits poll before sleeping (a bare number is microseconds); `--autotune` may change it where it is above 0"})
	Timeline = engine(&Setting{Name: "KOLO_TIMELINE", Kind: Text, Flag: "--timeline-filename",
		Help: "record a timeline of the job's ops (Chrome trace format) in this file"})
	TimelineMarkCycles = engine(&Setting{Name: "KOLO_TIMELINE_MARK_CYCLES", Kind: Bool, Flag: "--timeline-mark-cycles",
		Help: "mark the engine's cycles in the timeline"})
	Autotune = engine(&Setting{Name: "KOLO_AUTOTUNE", Kind: Bool, Default: "off", Flag: "--autotune",
		Help: "tune fusion threshold, cycle time, the collectives' knobs and the spin time while the job runs (docs/launcher.md)"})
	AutotuneLog = engine(&Setting{Name: "KOLO_AUTOTUNE_LOG", Kind: Text, Flag: "--autotune-log-file",
		Help: "rank 0's CSV log of every sample; a log that holds a decision is read back: the next run starts tuned"})
	AutotuneWarmupSamples = engine(&Setting{Name: "KOLO_AUTOTUNE_WARMUP_SAMPLES", Kind: Count, Default: "3", Flag: "--autotune-warmup-samples",
		Help: "samples discarded at the start"})
	AutotuneStepsPerSample = engine(&Setting{Name: "KOLO_AUTOTUNE_STEPS_PER_SAMPLE", Kind: Count, Default: "by time", Flag: "--autotune-steps-per-sample",
		Help: "optimizer steps per sample"})
	AutotuneMaxSamples = engine(&Setting{Name: "KOLO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", Kind: Count, Default: "20", Flag: "--autotune-bayes-opt-max-samples",
		Help: "measured samples before the autotuner must decide"})
	AutotuneNoise = engine(&Setting{Name: "KOLO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", Kind: Fraction, Default: "0.8", Flag: "--autotune-gaussian-process-noise",
		Help: "the Gaussian process's noise, in [0, 1]"})
)

// The other settings of a rank, and kolo run's own.
var (
	GoMaxProcs = &Setting{Name: "GOMAXPROCS", Kind: Text, Default: "host CPUs / local ranks in Python ranks",
		Help: "threads the Go runtime of a Python rank runs on at once (a Go program keeps its own)"}
	TCPFullMesh = &Setting{Name: "KOLO_TCP_FULL_MESH", Kind: Switch, Default: "0",
		Help: "`1` connects every rank of another host at start-up; by default a rank connects at start-up to rank 0, its ring neighbours and its hierarchical-allreduce peers, and to any other on first use"}
	Reports = &Setting{Name: "KOLO_REPORTS", Kind: Switch, Default: "1",
		Help: "`0`: ranks send kolo run no reports (no live view, metrics or end table); a failing rank still sends its failure record"}
	NCCL = &Setting{Name: "KOLO_NCCL", Horovod: []string{"HOROVOD_GPU_OPERATIONS", "HOROVOD_GPU_ALLREDUCE"}, Kind: Choice,
		Choices:        []string{"0", "false", "off", "no", "1", "true", "on", "yes", "auto"},
		HorovodChoices: []string{"NCCL", "MPI", "GLOO", "DDL", "CCL"}, Default: "auto",
		Help: "`0`: CUDA tensors are always staged through host memory; `1`: fail rather than stage when the NCCL path cannot serve (Horovod's names: `NCCL` is auto, another library is `0`; docs/pytorch.md, \"CUDA tensors\")"}
	CUDAPinned = &Setting{Name: "KOLO_CUDA_PINNED", Kind: Text, Default: "1",
		Help: "`0`: the PyTorch binding stages CUDA tensors through pageable host memory instead of pinned (for comparison)"}
	ReduceKernel = &Setting{Name: "KOLO_REDUCE_KERNEL", Kind: Text, Default: "the best the CPU runs",
		Help: "force the reduction kernels: `generic`, `avx2` or `avx512` (one the CPU cannot run is ignored); read when the process starts"}
	LogLevel = &Setting{Name: "KOLO_LOG_LEVEL", Kind: Choice, Choices: []string{"TRACE", "DEBUG", "INFO", "WARNING", "WARN", "ERROR", "FATAL"}, Default: "INFO", Flag: "--log-level",
		Help: "the ranks' log level (kolo.Init applies it unless the program installed its own logger)"}
	NetworkInterface = &Setting{Name: "KOLO_NETWORK_INTERFACE", Horovod: []string{"HOROVOD_GLOO_IFACE"}, Kind: Text, Flag: "--network-interface",
		Help: "the interface(s) whose address a rank listens on and advertises (`ib0,eth0`: the first present)"}
	ElasticTimeout = &Setting{Name: "KOLO_ELASTIC_TIMEOUT", Horovod: []string{"HOROVOD_ELASTIC_TIMEOUT"}, Kind: Seconds, Default: "600", Flag: "--elastic-timeout",
		Help: "how long an elastic worker waits for its next round"}
	Oversubscribe = &Setting{Name: "KOLO_OVERSUBSCRIBE", Kind: Switch, Default: "0", Flag: "--oversubscribe",
		Help: "in kolo run's environment: start more local ranks than this machine has CPUs"}
	Secret = &Setting{Name: "KOLO_SECRET", Horovod: []string{"HOROVOD_SECRET_KEY"}, Kind: Text,
		Help: "the job secret, under mpirun or srun with a rendezvous the user runs (kolo run makes its own)"}
	SecretFile = &Setting{Name: "KOLO_SECRET_FILE", Kind: Text,
		Help: "a file (mode 0600) holding the job secret, instead of KOLO_SECRET"}
	RendezvousDir = &Setting{Name: "KOLO_RENDEZVOUS_DIR", Kind: Text, Default: "~/.kolo/rendezvous",
		Help: "under mpirun or srun: the directory the ranks share where rank 0 publishes its rendezvous"}
	Library = &Setting{Name: "KOLO_LIBRARY", Kind: Text, Default: "the package's lib/libkolo.so",
		Help: "the engine library the Python package loads"}
	Bin = &Setting{Name: "KOLO_BIN", Kind: Text, Default: "the package's, else PATH's",
		Help: "the kolo launcher Python's kolo.run starts"}
)

// The contract: what the launcher sets for its ranks (docs/design.md). Horovod's names of the
// same values are set too, for scripts that read them.
var (
	Rank           = &Setting{Name: "KOLO_RANK", Horovod: []string{"HOROVOD_RANK"}, Kind: Count, Who: Launcher, Help: "the rank"}
	Size           = &Setting{Name: "KOLO_SIZE", Horovod: []string{"HOROVOD_SIZE"}, Kind: Count, Who: Launcher, Help: "the number of ranks"}
	LocalRank      = &Setting{Name: "KOLO_LOCAL_RANK", Horovod: []string{"HOROVOD_LOCAL_RANK"}, Kind: Count, Who: Launcher, Help: "the rank among its host's"}
	LocalSize      = &Setting{Name: "KOLO_LOCAL_SIZE", Horovod: []string{"HOROVOD_LOCAL_SIZE"}, Kind: Count, Who: Launcher, Help: "the ranks of its host"}
	CrossRank      = &Setting{Name: "KOLO_CROSS_RANK", Horovod: []string{"HOROVOD_CROSS_RANK"}, Kind: Count, Who: Launcher, Help: "its host's number"}
	CrossSize      = &Setting{Name: "KOLO_CROSS_SIZE", Horovod: []string{"HOROVOD_CROSS_SIZE"}, Kind: Count, Who: Launcher, Help: "the number of hosts"}
	Hostname       = &Setting{Name: "KOLO_HOSTNAME", Horovod: []string{"HOROVOD_HOSTNAME"}, Kind: Text, Who: Launcher, Help: "its host, as the launcher names it"}
	RendezvousAddr = &Setting{Name: "KOLO_RENDEZVOUS_ADDR", Kind: Text, Who: Launcher,
		Help: "host:port of the job's rendezvous"}
	JobID           = &Setting{Name: "KOLO_JOB_ID", Kind: Text, Who: Launcher, Help: "the job's id, which names its rendezvous records and shared memory"}
	LauncherVersion = &Setting{Name: "KOLO_LAUNCHER_VERSION", Kind: Text, Who: Launcher, Help: "the version of the kolo run that started the rank"}
	HostCPUs        = &Setting{Name: "KOLO_HOST_CPUS", Kind: Count, Who: Launcher, Help: "the CPUs this host gives its ranks (--bind-to core)"}
	Elastic         = &Setting{Name: "KOLO_ELASTIC", Kind: Text, Who: Launcher, Help: "1 in every worker of an elastic job"}
	ElasticHost     = &Setting{Name: "KOLO_ELASTIC_HOST", Kind: Text, Who: Launcher, Help: "an elastic worker's host, as the discovery names it"}
	ElasticSlot     = &Setting{Name: "KOLO_ELASTIC_SLOT", Kind: Count, Who: Launcher, Help: "an elastic worker's slot on its host"}
	ElasticRound    = &Setting{Name: "KOLO_ELASTIC_ROUND", Kind: Count, Who: Launcher, Help: "the round an elastic worker was started for"}
	RunPayload      = &Setting{Name: "KOLO_RUN_PAYLOAD", Kind: Text, Who: Launcher, Help: "Python's kolo.run: the pickled function a rank runs"}
	RunPayloadFile  = &Setting{Name: "KOLO_RUN_PAYLOAD_FILE", Kind: Text, Who: Launcher, Help: "Python's kolo.run: the file holding it, when large"}
)

// Kolo's own tests and benchmark scripts.
var (
	E2EExpect       = &Setting{Name: "KOLO_E2E_EXPECT", Kind: Text, Who: Harness, Help: "testbed/e2e: what a scenario's rank expects"}
	E2EScenario     = &Setting{Name: "KOLO_E2E_SCENARIO", Kind: Text, Who: Harness, Help: "testbed/e2e: the scenario a rank runs"}
	E2EStopMark     = &Setting{Name: "KOLO_E2E_STOP_MARK", Kind: Text, Who: Harness, Help: "testbed/e2e: where a stopped rank marks that it runs"}
	E2EStopSeconds  = &Setting{Name: "KOLO_E2E_STOP_SECONDS", Kind: Text, Who: Harness, Help: "testbed/e2e: how long a rank stops"}
	E2ETCPStream    = &Setting{Name: "KOLO_E2E_TCPSTREAM", Kind: Text, Who: Harness, Help: "testbed/e2e: the TCP stream a link-capped test measures"}
	RequireTestbeds = &Setting{Name: "KOLO_REQUIRE_TESTBEDS", Kind: Text, Who: Harness, Help: "tests fail instead of skipping where sshd, netns or Slurm cannot be set up"}
	BenchPython     = &Setting{Name: "KOLO_PYTHON", Kind: Text, Who: Harness, Help: "bench/: the Python with torch the comparisons run"}
)

// All is every declaration, in the README's order within each audience.
var All = []*Setting{
	FusionThreshold, CycleTime, CacheCapacity, StallCheckTime, StallShutdownTime, StallCrossedTime, ProgressTimeout,
	Autotune, SpinTime, GoMaxProcs, HierarchicalAllreduce, ShmStreamStores, SmallAllreduceBytes, ShmRoundBytes,
	TCPFullMesh, Reports, NCCL, Oversubscribe,
	StallCheckDisable, HierarchicalAllgather, StartTimeout, Timeline, TimelineMarkCycles,
	AutotuneLog, AutotuneWarmupSamples, AutotuneStepsPerSample, AutotuneMaxSamples, AutotuneNoise,
	CUDAPinned, ReduceKernel, LogLevel, NetworkInterface, ElasticTimeout, Secret, SecretFile, RendezvousDir, Library, Bin,

	Rank, Size, LocalRank, LocalSize, CrossRank, CrossSize, Hostname, RendezvousAddr, JobID, LauncherVersion, HostCPUs,
	Elastic, ElasticHost, ElasticSlot, ElasticRound, RunPayload, RunPayloadFile,

	E2EExpect, E2EScenario, E2EStopMark, E2EStopSeconds, E2ETCPStream, RequireTestbeds, BenchPython,
}

// engine declares a setting of the engine, which reads Horovod's spelling of each of its
// variables too (HOROVOD_X for KOLO_X; KOLO_* wins).
func engine(s *Setting) *Setting {
	s.Horovod = hv(s.Name)
	return s
}
