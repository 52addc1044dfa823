/* SPDX-License-Identifier: MIT */
/*
 * --cuda-graph: decode steps (one new token per sequence) run from CUDA graphs, as vLLM and
 * SGLang run theirs. The first decode step of a batch size is captured on the engine's stream
 * (cuStreamBeginCapture, the default GLOBAL mode as torch.cuda.graph uses), instantiated, and
 * every decode step of that size replays it (cuGraphLaunch): the kernels' arguments are the
 * ones captured, and everything that changes per step (tokens, positions, block tables, slot
 * mapping) is read from the step buffer at the captured address. The warm-up's one-token step
 * is captured at startup, as vLLM captures before serving. A promoted shadow replays graphs
 * it captured on scratch against the primary's memory mapped at the same addresses.
 * At TP > 1 the graph holds the step's all-reduces too, as vLLM's do (NCCL's kernels are
 * captured; the emulated NCCL captures each collective as a host node that runs it at replay).
 */
#include <errno.h>

#include "engine-gpu.h"
#include "engine-model.h"
#include "log.h"

#define MAX_GRAPHS 64

static struct {
	uint32_t ntok, nsample;
	CUgraphExec exec;
} graphs[MAX_GRAPHS];
static size_t n_graphs;

static CUgraphExec capture(struct model *m, uint32_t ntok, uint32_t nsample,
			   int (*launch)(struct model *, uint32_t, uint32_t, uint32_t))
{
	CUgraphExec exec = NULL;
	CUgraph g = NULL;
	CUresult cr;
	int r;

	cr = gpu.cuStreamBeginCapture(gpu_stream(), CU_STREAM_CAPTURE_MODE_GLOBAL);
	if (cr != CUDA_SUCCESS) {
		log_error("Capturing a decode graph of %u: %s", ntok, gpu_strerror(cr));
		return NULL;
	}
	r = launch(m, ntok, ntok, nsample);
	cr = gpu.cuStreamEndCapture(gpu_stream(), &g);
	if (r < 0 || cr != CUDA_SUCCESS) {
		log_error("Capturing a decode graph of %u failed: %s", ntok,
			  cr != CUDA_SUCCESS ? gpu_strerror(cr) : "a launch failed");
		if (g)
			(void)gpu.cuGraphDestroy(g);
		return NULL;
	}
	cr = gpu.cuGraphInstantiateWithFlags(&exec, g, 0);
	(void)gpu.cuGraphDestroy(g);
	if (cr != CUDA_SUCCESS) {
		log_error("Instantiating a decode graph of %u: %s", ntok, gpu_strerror(cr));
		return NULL;
	}
	return exec;
}

int graph_run(struct model *m, uint32_t ntok, uint32_t nrows, uint32_t nsample,
	      int (*launch)(struct model *, uint32_t, uint32_t, uint32_t))
{
	CUgraphExec exec = NULL;
	CUresult cr;

	if (!m->cuda_graph || ntok != nrows)
		return 0; /* eager: prefill, or graphs off */
	for (size_t i = 0; i < n_graphs && !exec; i++)
		if (graphs[i].ntok == ntok && graphs[i].nsample == nsample)
			exec = graphs[i].exec;
	if (!exec) {
		if (n_graphs == MAX_GRAPHS)
			return 0;
		exec = capture(m, ntok, nsample, launch);
		if (!exec)
			return -EIO;
		graphs[n_graphs].ntok = ntok;
		graphs[n_graphs].nsample = nsample;
		graphs[n_graphs].exec = exec;
		n_graphs++;
	}
	cr = gpu.cuGraphLaunch(exec, gpu_stream());
	if (cr != CUDA_SUCCESS)
		return log_error_errno(gpu_errno(cr), "Replaying the decode graph of %u: %s", ntok,
				       gpu_strerror(cr));
	return 1;
}
