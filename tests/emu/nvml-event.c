/* SPDX-License-Identifier: MIT */
/*
 * Event sets of the emulated libnvidia-ml.so.1 ("Event Handling Methods"). XID events come
 * from the run's per-device event ring (emu_xid_raise, emu-ctl), ECC events from its error
 * counters (emu_ecc_raise): a set sees what happens after a device was registered in it, each
 * XID as one event carrying its number (on Linux "every Xid error event would return the
 * associated event data"), and each rise of an ECC counter as one event. Waiting polls the
 * shared state every few milliseconds up to the caller's timeout.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "nvml-internal.h"

#define SUPPORTED_EVENTS                                                   \
	(nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | \
	 nvmlEventTypeXidCriticalError)
#define POLL_MS 2

struct registration {
	unsigned long long mask;
	uint64_t xid_cursor;
	uint64_t ecc_seen[2]; /* corrected, uncorrected */
};

struct nvmlEventSet_st {
	pthread_mutex_t lock;
	struct registration reg[EMU_MAX_DEVICES];
	int next; /* device to look at first: no device starves the others */
};

_public_ nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
	struct nvmlEventSet_st *s;

	NVML_ENTER("nvmlEventSetCreate");
	if (!set)
		return NVML_ERROR_INVALID_ARGUMENT;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NVML_ERROR_MEMORY;
	pthread_mutex_init(&s->lock, NULL);
	*set = s;
	return NVML_SUCCESS;
}

_public_ nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
	NVML_ENTER("nvmlEventSetFree");
	if (!set)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_destroy(&set->lock);
	free(set);
	return NVML_SUCCESS;
}

_public_ nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
						       unsigned long long *event_types)
{
	NVML_ENTER("nvmlDeviceGetSupportedEventTypes");
	if (nvml_device_index(device) < 0 || !event_types)
		return NVML_ERROR_INVALID_ARGUMENT;
	*event_types = SUPPORTED_EVENTS;
	return NVML_SUCCESS;
}

/* "NVML_ERROR_NOT_SUPPORTED if the platform does not support this feature or some of
 * requested event types". Only later events are delivered: the cursors start now. */
_public_ nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long event_types,
					       nvmlEventSet_t set)
{
	struct registration *reg;
	int dev;

	NVML_ENTER("nvmlDeviceRegisterEvents");
	dev = nvml_device_index(device);
	if (dev < 0 || !set)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (event_types & ~(unsigned long long)SUPPORTED_EVENTS)
		return NVML_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&set->lock);
	reg = &set->reg[dev];
	if ((event_types & nvmlEventTypeXidCriticalError) &&
	    !(reg->mask & nvmlEventTypeXidCriticalError))
		reg->xid_cursor = emu_xid_count(dev);
	if ((event_types & nvmlEventTypeSingleBitEccError) &&
	    !(reg->mask & nvmlEventTypeSingleBitEccError))
		reg->ecc_seen[0] = emu_ecc_count(dev, false);
	if ((event_types & nvmlEventTypeDoubleBitEccError) &&
	    !(reg->mask & nvmlEventTypeDoubleBitEccError))
		reg->ecc_seen[1] = emu_ecc_count(dev, true);
	reg->mask |= event_types;
	pthread_mutex_unlock(&set->lock);
	return NVML_SUCCESS;
}

static bool next_event(struct nvmlEventSet_st *set, int dev, nvmlEventData_t *data)
{
	struct registration *reg = &set->reg[dev];
	unsigned xid;

	*data = (nvmlEventData_t){
		.device = &nvml_devices[dev],
		.gpuInstanceId = 0xFFFFFFFFu,
		.computeInstanceId = 0xFFFFFFFFu,
	};
	if ((reg->mask & nvmlEventTypeXidCriticalError) &&
	    emu_xid_next(dev, &reg->xid_cursor, &xid)) {
		data->eventType = nvmlEventTypeXidCriticalError;
		data->eventData = xid;
		return true;
	}
	for (int u = 1; u >= 0; u--) {
		unsigned long long bit =
			u ? nvmlEventTypeDoubleBitEccError : nvmlEventTypeSingleBitEccError;
		uint64_t now;

		if (!(reg->mask & bit))
			continue;
		now = emu_ecc_count(dev, u);
		if (now > reg->ecc_seen[u]) {
			reg->ecc_seen[u] = now;
			data->eventType = (unsigned long long)bit;
			return true;
		}
	}
	return false;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* "If some events are ready to be delivered at the time of the call, function returns
 * immediately. If there are no events ready to be delivered, function sleeps till event
 * arrives but not longer than specified timeout." NVML_ERROR_TIMEOUT when none came. */
_public_ nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
					  unsigned int timeoutms)
{
	uint64_t deadline = now_ms() + timeoutms;
	int ndev;

	NVML_ENTER("nvmlEventSetWait_v2");
	if (!set || !data)
		return NVML_ERROR_INVALID_ARGUMENT;
	ndev = emu_state_ndevices();
	for (;;) {
		struct timespec ts = {0};
		nvmlEventData_t ev;
		bool found = false;
		uint64_t now;

		pthread_mutex_lock(&set->lock);
		for (int i = 0; i < ndev && !found; i++) {
			int dev = (set->next + i) % ndev;

			if (next_event(set, dev, &ev)) {
				set->next = (dev + 1) % ndev;
				found = true;
			}
		}
		pthread_mutex_unlock(&set->lock);
		if (found) {
			*data = ev;
			return NVML_SUCCESS;
		}
		now = now_ms();
		if (now >= deadline)
			return NVML_ERROR_TIMEOUT;
		ts.tv_nsec = (long)MIN(deadline - now, POLL_MS) * 1000000L;
		(void)nanosleep(&ts, NULL);
	}
}

/* nvmlEventSetWait (v1) takes the same arguments. */
extern __typeof__(nvmlEventSetWait_v2) nvmlEventSetWait
	__attribute__((alias("nvmlEventSetWait_v2"), visibility("default")));
