/* SPDX-License-Identifier: MIT */
/*
 * The part of systemd's bus API a stopping supervisor asks (is this a restart?), on a private
 * bus: owns org.freedesktop.systemd1 and answers Manager.GetUnitByPID, Unit.Job and
 * Job.JobType. The job type is read from the file named by argv[1] at each question ("stop",
 * "restart", or empty: no job), so a test can change it. Prints "ready" once the name is
 * owned. Usage: DBUS_SYSTEM_BUS_ADDRESS=... fake-systemd JOBTYPE_FILE
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <systemd/sd-bus.h>

#define UNIT_PATH "/org/freedesktop/systemd1/unit/belayer_2dsupervisor_2eservice"
#define JOB_PATH  "/org/freedesktop/systemd1/job/42"

static const char *type_file;

static void job_type(char *buf, size_t cap)
{
	FILE *f = fopen(type_file, "re");

	buf[0] = '\0';
	if (f) {
		if (!fgets(buf, (int)cap, f))
			buf[0] = '\0';
		fclose(f);
	}
	buf[strcspn(buf, "\n")] = '\0';
}

static int get_unit_by_pid(sd_bus_message *m, void *userdata, sd_bus_error *err)
{
	uint32_t pid;
	int r = sd_bus_message_read(m, "u", &pid);

	if (r < 0)
		return r;
	return sd_bus_reply_method_return(m, "o", UNIT_PATH);
}

static int prop_job(sd_bus *bus, const char *path, const char *interface, const char *property,
		    sd_bus_message *reply, void *userdata, sd_bus_error *err)
{
	char type[64];

	job_type(type, sizeof(type));
	return type[0] ? sd_bus_message_append(reply, "(uo)", 42u, JOB_PATH)
		       : sd_bus_message_append(reply, "(uo)", 0u, "/");
}

static int prop_job_type(sd_bus *bus, const char *path, const char *interface, const char *property,
			 sd_bus_message *reply, void *userdata, sd_bus_error *err)
{
	char type[64];

	job_type(type, sizeof(type));
	return sd_bus_message_append(reply, "s", type);
}

static const sd_bus_vtable manager_vtable[] = {
	SD_BUS_VTABLE_START(0),
	SD_BUS_METHOD("GetUnitByPID", "u", "o", get_unit_by_pid, 0),
	SD_BUS_VTABLE_END,
};

static const sd_bus_vtable unit_vtable[] = {
	SD_BUS_VTABLE_START(0),
	SD_BUS_PROPERTY("Job", "(uo)", prop_job, 0, 0),
	SD_BUS_VTABLE_END,
};

static const sd_bus_vtable job_vtable[] = {
	SD_BUS_VTABLE_START(0),
	SD_BUS_PROPERTY("JobType", "s", prop_job_type, 0, 0),
	SD_BUS_VTABLE_END,
};

int main(int argc, char **argv)
{
	sd_bus *bus = NULL;
	int r;

	if (argc != 2) {
		fprintf(stderr, "Usage: fake-systemd JOBTYPE_FILE\n");
		return 2;
	}
	type_file = argv[1];
	r = sd_bus_open_system(&bus);
	if (r >= 0)
		r = sd_bus_add_object_vtable(bus, NULL, "/org/freedesktop/systemd1",
					     "org.freedesktop.systemd1.Manager", manager_vtable,
					     NULL);
	if (r >= 0)
		r = sd_bus_add_object_vtable(bus, NULL, UNIT_PATH, "org.freedesktop.systemd1.Unit",
					     unit_vtable, NULL);
	if (r >= 0)
		r = sd_bus_add_object_vtable(bus, NULL, JOB_PATH, "org.freedesktop.systemd1.Job",
					     job_vtable, NULL);
	if (r >= 0)
		r = sd_bus_request_name(bus, "org.freedesktop.systemd1", 0);
	if (r < 0) {
		fprintf(stderr, "fake-systemd: %s\n", strerror(-r));
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		r = sd_bus_process(bus, NULL);
		if (r < 0)
			return 1;
		if (r == 0 && sd_bus_wait(bus, UINT64_MAX) < 0)
			return 1;
	}
}
