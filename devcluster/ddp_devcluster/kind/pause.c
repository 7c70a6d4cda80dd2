/* The sandbox ("pause") process of the real node's pods: it holds a pod's namespaces, reaps
 * the orphans handed to it, and exits on SIGINT or SIGTERM. ddp_devcluster.node.images builds
 * it with `gcc -static` into a one-file image, since no registry can be pulled from here. */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction action = {0};
    action.sa_handler = stop;
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    action.sa_handler = reap;
    action.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &action, NULL);
    for (;;) {
        pause();
    }
}
