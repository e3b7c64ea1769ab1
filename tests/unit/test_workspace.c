/* test_workspace.c - unit tests for the workspace module (being written). */
#include <criterion/criterion.h>

Test(workspace, placeholder_until_the_module_lands)
{
    cr_assert(1 + 1 == 2);
}
