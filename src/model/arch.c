/* arch.c - the list of architecture tables compiled in; the one place that names them. */
#include "model/arch.h"

#include <string.h>

static const ms_arch *const all_archs[] = {&ms_arch_glm4_moe, &ms_arch_glm_moe_dsa, NULL};

const ms_arch *const *ms_arch_all(void) { return all_archs; }

const ms_arch *ms_arch_find(const char *name) {
    for (const ms_arch *const *a = all_archs; *a; a++)
        if (!strcmp((*a)->name, name)) return *a;
    return NULL;
}
