/* SPDX-License-Identifier: MIT */
/* belayer-bench recovery: shared between the measuring code and the process plumbing. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define REC_MAX_TP	    4
#define REC_MAX_SIZES	    8
#define REC_NPROMPTS	    4
#define REC_NEW_TOKENS	    8
#define REC_READY_MS	    600000 /* the longest any engine may take to become ready */
#define REC_MAX_CHILD	    8
#define REC_QUICK_TIMEOUT_S 200 /* --quick's default --timeout */

/* Where the programs a run needs are (a build tree by default). */
struct rec_paths {
	char engine[4096];     /* belayer-test-engine */
	char gen[4096];	       /* gen-weights */
	char kernels[4096];    /* libengine-kernels-host.so (BELAYER_EMU_KERNELS) */
	char supervisor[4096]; /* belayer-supervisor */
	char ctl[4096];	       /* belayerctl */
	const char *shim;      /* libbelayer.so */
	const char *driver;    /* emulated libcuda.so.1's directory */
};

struct bench_args;
/* The programs of the build tree build; shim and driver from the bench's arguments. */
void rec_paths_init(struct rec_paths *p, const struct bench_args *a, const char *build);

/* Phases of one recovery, in ms; a negative value: the phase does not exist on that path. */
enum rec_phase {
	PH_DETECT,  /* SIGKILL -> death seen (pidfd) */
	PH_OWNER,   /* surviving ranks of the group stopped */
	PH_HEALTH,  /* GPU health check */
	PH_CONTENT, /* weights checksums */
	PH_LAYOUT,  /* layout hash + count */
	PH_REMAP,   /* the shadow maps the retained memory */
	PH_CANARY,  /* the promoted group answers the canary prompt as the primary did */
	PH_LOAD, /* cold: spawn -> the engine's own ready line (CUDA, NCCL, weights, KV, warm-up) */
	PH_READY, /* -> /health 200 and the first /generate returned */
	PH_COUNT
};
extern const char *const rec_phase_names[PH_COUNT];

/* One engine group under test (rank 0's pid; the other ranks are its children). */
struct rec_engine {
	pid_t pid;
	int pidfd;
	uint16_t port;
};

/* One case's private world: temporary directory, emulator state, supervisor. */
struct rec_world {
	char dir[4096];
	char socket[4200];
	pid_t sup_pid;
	int sup_pidfd;
	char emu_mem[32];
	unsigned tp;
};

/* The bench as a child subreaper, and ^C/SIGTERM/SIGHUP handlers that stop the current world
 * (supervisor, engines, temporary directory) before exiting. */
int rec_guard_install(void);
/* A directory the handlers also remove (the weights files; NULL: none). */
void rec_guard_dir(const char *dir);
int rec_world_open(struct rec_world *w, const struct rec_paths *p, unsigned tp,
		   uint64_t weights_bytes, const char *config);
void rec_world_close(struct rec_world *w);

/* Runs gen-weights: a deterministic model of about `bytes` from `seed`. */
int rec_gen_weights(const struct rec_paths *p, const char *out, uint64_t bytes, unsigned seed);

/* Starts the engine under the shim (connected to the world's supervisor); does not wait. */
int rec_engine_spawn(const struct rec_world *w, const struct rec_paths *p, const char *weights,
		     uint16_t port, struct rec_engine *ret);
/* Waits until GET /health answers 200 (time in *health_ns when not NULL) and then one
 * /generate returned. 0 or -errno. */
int rec_engine_wait_ready(const struct rec_engine *e, int timeout_ms, uint64_t *health_ns);
void rec_engine_kill(struct rec_engine *e);
/* The pid of rank `rank` (0: the engine itself; others: its children in spawn order). */
pid_t rec_engine_rank_pid(const struct rec_engine *e, unsigned rank);

/* The answers (output token ids) to the fixed prompts, and the reported weights version. */
struct rec_answers {
	int32_t ids[REC_NPROMPTS][REC_NEW_TOKENS];
	int64_t weights_version;
};
int rec_answers_get(uint16_t port, struct rec_answers *ret);
bool rec_answers_equal(const struct rec_answers *a, const struct rec_answers *b);
int rec_update_weights(uint16_t port, const char *path);

/* Reserves a free loopback port (bound then closed: good enough on a quiet machine). */
int rec_free_port(uint16_t *ret);
int rec_pidfd_wait(int pidfd, int timeout_ms);
/* fork + exec argv with extra "K=V" env entries; the child dies with this process. */
pid_t rec_spawn(char *const argv[], char *const env[], const char *out_path);
uint64_t rec_now_ns(void);
/* The run's deadline (--timeout): every wait of the bench is bounded by its own limit and by
 * what is left of the run, so a stuck step fails with its reason instead of hanging. */
void rec_deadline_set(unsigned seconds);
/* min(want_ms, ms left to the deadline), >= 0. */
int rec_bound_ms(int want_ms);
bool rec_deadline_passed(void);
/* Runs argv to completion within timeout_ms; 0 when it exited 0. */
int rec_run_wait(char *const argv[], char *const env[], const char *out, int timeout_ms);
/* Waits until something accepts connections on the loopback port: 0, or -ETIMEDOUT. */
int rec_wait_port(uint16_t port, int timeout_ms);

/* A gnuplot run: rec_plot_open() makes a temporary directory with a data file and a script
 * open for writing (the script names the data file as `dat`); rec_plot_run() closes both, runs
 * gnuplot on the script and removes the directory. */
struct rec_plot {
	char dir[32], dat[64], gp[64];
	FILE *data, *script;
};
int rec_plot_open(struct rec_plot *pl);
int rec_plot_run(struct rec_plot *pl);

enum rec_path {
	PATH_COLD,
	PATH_SAMPLED,
	PATH_FULL,
	PATH_COUNT
};

struct rec_case {
	uint64_t bytes;
	unsigned tp;
	enum rec_path path;
	bool ran;
	bool ok;
	char note[224];
	double ph[PH_COUNT]; /* ms; < 0: not on this path */
	double total_ms;
	bool equal_prefailure; /* answers after recovery == pre-failure (latest weights) */
	bool equal_v0;	       /* answers after recovery == before the weight update */
	int64_t version_after;
	/* What one parked shadow rank held before the kill (the largest rank's, as `belayerctl
	 * workers` reports it); bytes, -1: not reported by this supervisor. */
	int64_t shadow_device, shadow_rss, shadow_pss, shadow_shmem;
};

/* Starts the world, the primary and the first answers shared by every path. */
int rec_start_primary(const struct rec_world *w, const struct rec_paths *p, const char *wfile,
		      const char *ufile, struct rec_engine *e, struct rec_answers *v0,
		      struct rec_answers *v1);

/* Shadow promotion (bench-recovery-shadow.c): whether this build's supervisor can promote,
 * and one promotion case measured with the same "ready" as the cold path. */
bool rec_shadow_supported(const struct rec_paths *p);
/* How the victim (the last primary rank) fails: SIGKILL, or SIGSTOP (a hang the NCCL
 * detector must find; the bench then sends one request so its peers enter a collective). */
enum rec_fault {
	REC_FAULT_KILL,
	REC_FAULT_STOP,
};
/* rec_run_shadow with a fault and extra supervisor configuration appended. */
int rec_run_shadow_fault(const struct rec_paths *p, const char *wfile, const char *ufile,
			 const char *verify, enum rec_fault fault, const char *extra_config,
			 struct rec_case *c);
int rec_run_shadow(const struct rec_paths *p, const char *wfile, const char *ufile,
		   const char *verify, struct rec_case *c);
int rec_pidfd_open(pid_t pid);
