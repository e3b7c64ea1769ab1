/* test_cgroup.c - unit tests for the cgroup module (being written). */
#include <criterion/criterion.h>

Test(cgroup, placeholder_until_the_module_lands)
{
    cr_assert(1 + 1 == 2);
}
